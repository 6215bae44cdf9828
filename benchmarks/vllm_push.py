"""Real vLLM P/D engines in push mode: stock ``NixlPushConnector`` and ``LeaseprotoPushConnector``.

The same tiny local model and loopback NIXL (UCX, CPU) as ``vllm_pd.py``, with this
script as the push router: each request goes to P (``do_remote_decode``, one token)
and to D (``do_remote_prefill``, naming P's engine and side channel) at once, with
the same ``X-Request-Id``, so vLLM's engines give it the same base id. D allocates
the request's blocks when it schedules it and registers them with P (``PUSH_REG``);
P WRITEs its KV into them.

One phase, a surge: more requests than D runs at once (two), so later requests wait
in D's queue, unregistered, while P's prefill is done and its blocks are under P's
lease. D's heartbeats must keep that lease alive: stock vLLM's name the router's id
(B2), which P never granted, so P frees the blocks at ``kv_lease_duration`` and the
request never gets its KV. Per pair it prints requests, completions identical to a
single-instance run, requests that got no answer within the client timeout, P's
expired leases, and (ours) D's pushed KV used and receives failed, and check-trace
of the traces. Run with the vLLM environment of docs/vllm.md::

    nice python benchmarks/vllm_push.py --json vllm_push.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from _common import machine, table
from _reaper import die_with_parent
from _vllm_pairs import SHAPE, metrics, post, prompt, references
from _vllm_server import LEASE, Server
from _vllm_traces import report_traces, validate

from leaseproto.integrations.vllm.tinymodel import build_tiny_model

PAIRS = {
    "stock": ("NixlPushConnector", "NixlPushConnector"),
    "leaseproto": ("LeaseprotoPushConnector", "LeaseprotoPushConnector"),
    "ours P + stock D": ("LeaseprotoPushConnector", "NixlPushConnector"),
    "stock P + ours D": ("NixlPushConnector", "LeaseprotoPushConnector"),
}
#: push_registration_timeout (seconds): the registration's initial lease
REGISTRATION = 2 * LEASE


def post_as(port: int, body: dict[str, Any], rid: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": rid},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def route(p: Server, d: Server, text: str, max_tokens: int, timeout: float) -> str | None:
    """The push router: P and D at once; D's answer is the completion (None: none in time)."""
    rid = uuid.uuid4().hex
    d_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "P0",
        "remote_request_id": f"cmpl-{rid}-0",  # what the router knows; vLLM's D heartbeats it
        "remote_host": "127.0.0.1",
        "remote_port": p.side_port,
        "tp_size": 1,
    }
    p_body = {
        "model": "m",
        "prompt": text,
        "max_tokens": 1,
        "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    prefill = threading.Thread(target=lambda: post_as(p.port, p_body, rid, timeout), daemon=True)
    prefill.start()
    body = {"model": "m", "prompt": text, "max_tokens": max_tokens, "temperature": 0}
    try:
        out = post_as(d.port, {**body, "kv_transfer_params": d_params}, rid, timeout)
    except (urllib.error.URLError, OSError):
        return None
    return str(out["choices"][0]["text"])


def run_pair(name: str, model: Path, logs: Path, n: int, max_tokens: int, *, timeout: float) -> Any:
    tag = name.replace(" ", "_").replace("+", "")
    traces = logs / f"push-{tag}-traces"
    servers = []
    roles = (("kv_producer", "P0"), ("kv_consumer", "D0"))
    for (role, engine), conn in zip(roles, PAIRS[name], strict=True):
        cpu, seqs, blocks = SHAPE[role]
        servers.append(
            Server(
                model=model,
                role=role,
                connector=conn,
                cpu=cpu,
                log=logs / f"push-{tag}-{engine}.log",
                max_num_seqs=seqs,
                blocks=blocks,
                traces=traces,
                engine_id=engine,
                more={"push_registration_timeout": REGISTRATION},
            )
        )
    p, d = servers
    try:
        p.wait_up()
        d.wait_up()
        ref = references(p.port, n, max_tokens)
        before_p, before_d = metrics(p.port), metrics(d.port)
        results: dict[int, str | None] = {}
        started = time.monotonic()
        threads = [
            threading.Thread(
                target=lambda i=i: results.__setitem__(
                    i, route(p, d, prompt(i), max_tokens, timeout)
                )
            )
            for i in range(n)
        ]
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=timeout + 60)
        elapsed = time.monotonic() - started
        post(p.port, {"model": "m", "prompt": prompt(999), "max_tokens": 1})  # P steps
        time.sleep(2)
        after_p, after_d = metrics(p.port), metrics(d.port)

        def delta(a: dict[str, float], b: dict[str, float], key: str) -> int:
            return int(a.get(key, 0.0) - b.get(key, 0.0))

        served = [i for i, r in results.items() if r is not None]
        row: dict[str, Any] = {
            "requests": n,
            "completed": len(served),
            "identical": sum(results[i] == ref[i] for i in served),
            "no_answer": n - len(served),
            "expired_on_p": delta(after_p, before_p, "vllm:nixl_num_kv_expired_reqs"),
            "pushed_used_d": delta(after_d, before_d, "vllm:leaseproto_push_writes_verified"),
            "recv_failed_d": delta(after_d, before_d, "vllm:leaseproto_push_recv_failed"),
            "renewed_on_p": delta(after_p, before_p, "vllm:leaseproto_leases_renewed"),
            "seconds": round(elapsed, 1),
        }
        print(name, row, flush=True)
    finally:
        d.stop()
        p.stop()
    row["trace"] = validate(traces)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=240.0, help="client timeout per request, s")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args()
    die_with_parent()  # and each server with this process (_reaper)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_push-"))
    model = build_tiny_model(work / "tiny-qwen3")
    results = {
        name: run_pair(name, model, work, args.requests, args.max_tokens, timeout=args.timeout)
        for name in args.pairs
    }
    header = (
        "pair",
        "requests",
        "identical",
        "no answer",
        "expired (P)",
        "used (D)",
        "failed (D)",
        "renewals (P)",
    )
    rows = [
        (
            name,
            r["requests"],
            f"{r['identical']}/{r['completed']}",
            r["no_answer"],
            r["expired_on_p"],
            r["pushed_used_d"],
            r["recv_failed_d"],
            r["renewed_on_p"],
        )
        for name, r in results.items()
    ]
    print(f"kv_lease_duration {LEASE} s, push_registration_timeout {REGISTRATION} s; {machine()}")
    print(table(header, rows))
    report_traces(results, args.json)


if __name__ == "__main__":
    main()
