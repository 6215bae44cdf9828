"""Real vLLM P/D engines side by side: stock ``NixlConnector`` and ``LeaseprotoConnector``.

Builds a tiny random model locally (no downloads), starts a real vLLM prefill server and
decode server on loopback with NIXL (UCX) on CPU, and routes completions the way vLLM's
toy proxy does (prefill on P with ``do_remote_decode``, then decode on D with P's
``kv_transfer_params``; this script is the router). The same schedule runs for each pair
of connectors: stock/stock, ours/ours, ours P + stock D, stock P + ours D:

1. surge: more requests than D runs at once, so some wait in D's queue for several
   initial leases;
2. stall: D is SIGSTOPped past the lease extension while requests wait in its queue and
   P serves other prompts into the freed blocks, then SIGCONTed;
3. kill: D is SIGKILLed with requests queued; the time from the kill to P's last
   expiry is measured against its bound (``lease_extension + heartbeat_interval``, or the
   initial lease for a lease never renewed).

Per run it prints requests, completions identical to a single-instance run of the same
model (P serving the prompt whole), leases expired on P, late reads P detected, reads D
used without verification, reads D recomputed, and kill -> last free. ``--json FILE``
writes the same. Run with the vLLM environment of docs/vllm.md::

    python benchmarks/vllm_pd.py --json vllm_pd.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from _common import machine, table
from _reaper import die_with_parent
from _vllm_latency import PREFILL, completion, d_leg_rounds, summarise, verdict_table
from _vllm_server import LEASE, Server
from _vllm_stall import STALL_S, Watchdog
from _vllm_traces import report_traces, validate
from _vllm_turns import tokens, two_turns

from leaseproto.integrations.vllm.tinymodel import WORDS, build_tiny_model

PAIRS = {
    "stock": ("NixlConnector", "NixlConnector"),
    "leaseproto": ("LeaseprotoConnector", "LeaseprotoConnector"),
    "ours P + stock D": ("LeaseprotoConnector", "NixlConnector"),
    "stock P + ours D": ("NixlConnector", "LeaseprotoConnector"),
}


def prompt(i: int, n: int = 90) -> str:
    return " ".join(WORDS[(i * 7 + j * (i % 5 + 1)) % len(WORDS)] for j in range(n))


def post(port: int, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def metrics(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("vllm:nixl_", "vllm:leaseproto_")) and "_total" in line:
            name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


#: when each prefill's reply reached the router (time.monotonic()): P's scheduler stamps
#: the lease as it finishes the prefill, just before it replies, so the lease begins here
PREFILLED: list[float] = []


def route(p: Server, d: Server, text: str, max_tokens: int) -> str | None:
    """vLLM's toy proxy: prefill on P (one token, KV kept for D), then decode on D."""
    first = post(p.port, completion(text, PREFILL))
    PREFILLED.append(time.monotonic())
    try:
        out = post(d.port, completion(text, first["kv_transfer_params"], max_tokens))
    except (urllib.error.URLError, OSError):
        return None
    return str(out["choices"][0]["text"])


#: role -> (CPU to bind, most requests running at once, KV blocks): P small enough that freed
#: blocks are reused soon; D running two at a time, so requests queue
SHAPE = {"kv_producer": ("0", 8, 32), "kv_consumer": ("1", 2, 256)}


def server(
    model: Path,
    role: str,
    connector: str,
    log: Path,
    traces: Path,
    *,
    bidirectional: bool = False,
    more: dict[str, Any] | None = None,
) -> Server:
    cpu, seqs, blocks = SHAPE[role]
    return Server(
        model=model,
        role=role,
        connector=connector,
        cpu=cpu,
        log=log,
        max_num_seqs=seqs,
        blocks=blocks,
        traces=traces,
        bidirectional=bidirectional,
        more=more,
    )


def run_pair(name: str, model: Path, logs: Path, n: int, max_tokens: int) -> dict[str, Any]:
    p_conn, d_conn = PAIRS[name]
    tag = name.replace(" ", "_").replace("+", "")
    traces = logs / f"{tag}-traces"
    p = server(model, "kv_producer", p_conn, logs / f"{tag}-P.log", traces)
    d = server(model, "kv_consumer", d_conn, logs / f"{tag}-D.log", traces)
    rows: dict[str, Any] = {}
    try:
        p.wait_up()
        d.wait_up()
        ref = {
            i: str(
                post(
                    p.port,
                    {"model": "m", "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0},
                )["choices"][0]["text"]
            )
            for i in range(n)
        }
        for phase in ("surge", "stall", "kill"):
            before_p, before_d = metrics(p.port), metrics(d.port)
            results: dict[int, str | None] = {}
            threads = [
                threading.Thread(
                    target=lambda i=i, results=results: results.__setitem__(
                        i, route(p, d, prompt(i), max_tokens)
                    )
                )
                for i in range(n)
            ]
            for t in threads:
                t.start()
                time.sleep(0.2)
            kill_at, last_free = None, None
            if phase == "stall":
                time.sleep(3)
                os.killpg(d.proc.pid, signal.SIGSTOP)
                # past the initial lease (no heartbeat reaches P), then long enough for the
                # fillers to cycle P's free queue through the freed blocks
                stall_end = time.monotonic() + LEASE + 12
                k = 1000
                while time.monotonic() < stall_end:  # P reuses the freed blocks
                    post(p.port, {"model": "m", "prompt": prompt(k, 120), "max_tokens": 1})
                    k += 1
                os.killpg(d.proc.pid, signal.SIGCONT)
            if phase == "kill":
                time.sleep(3)
                os.killpg(d.proc.pid, signal.SIGKILL)
                kill_at = time.monotonic()
                expired0 = metrics(p.port).get("vllm:nixl_num_kv_expired_reqs", 0.0)
                end = kill_at + 3 * LEASE
                while time.monotonic() < end:
                    now = metrics(p.port).get("vllm:nixl_num_kv_expired_reqs", 0.0)
                    if now > expired0:
                        expired0, last_free = now, time.monotonic()
                    time.sleep(0.25)
            for t in threads:
                t.join(timeout=600)
            # P handles notifications only when it steps: make it step, then give the
            # counters two stats intervals to catch up
            post(p.port, {"model": "m", "prompt": prompt(999), "max_tokens": 1})
            time.sleep(2)
            after_p, after_d = metrics(p.port), metrics(d.port)
            d_alive = phase != "kill"

            def delta(a: dict[str, float], b: dict[str, float], key: str) -> int:
                return int(a.get(key, 0.0) - b.get(key, 0.0))

            served = [i for i, r in results.items() if r is not None]
            verified = delta(after_d, before_d, "vllm:leaseproto_reads_verified")
            recomputed = delta(after_d, before_d, "vllm:leaseproto_reads_refused") + delta(
                after_d, before_d, "vllm:leaseproto_reads_verdict_timeout"
            )
            late = delta(after_p, before_p, "vllm:nixl_num_notifications_after_expiry")
            rows[phase] = {
                "requests": n,
                "completed": len(served),
                "identical": sum(results[i] == ref[i] for i in served),
                "expired": delta(after_p, before_p, "vllm:nixl_num_kv_expired_reqs"),
                "wrong": sum(results[i] != ref[i] for i in served),
                "late_reads": late,
                "unverified": max(0, len(served) - verified - recomputed) if d_alive else None,
                "recomputed": recomputed if d_alive else None,
                "kill_to_last_free_s": (
                    None if kill_at is None or last_free is None else round(last_free - kill_at, 2)
                ),
                # the bound runs from the last grant (leases granted after the kill count)
                "last_grant_to_last_free_s": (
                    None
                    if last_free is None
                    else round(last_free - max(t for t in PREFILLED if t <= last_free), 2)
                ),
                "bound_s": LEASE if phase == "kill" else None,
            }
            print(name, phase, rows[phase], flush=True)
            if phase == "kill":
                break
        rows["reference_distinct"] = len(set(ref.values()))
    finally:
        d.stop()
        p.stop()
    rows["trace"] = validate(traces)
    return rows


#: A request that has stalled (its stacks taken at ``STALL_S``) is given up this much
#: later: sooner than vLLM's 300 s execute-model timeout, which would end the engine
#: anyway, so that a restart (``--restarts``) costs minutes less.
GIVE_UP_AFTER_STALL_S = 60.0


def watched_post(watchdog: Watchdog, label: str, port: int, body: dict[str, Any]) -> dict[str, Any]:
    """:func:`post`, its stall timed by ``watchdog``: a request that has not been
    answered ``GIVE_UP_AFTER_STALL_S`` after its stacks were taken fails with a timeout
    (the stalls seen took 136 s, or never ended)."""
    with watchdog.request(f"{label} to port {port}"):
        return post(port, body, timeout=STALL_S + GIVE_UP_AFTER_STALL_S)


def run_two_turns(
    name: str,
    model: Path,
    logs: Path,
    n: int,
    max_tokens: int,
    *,
    first: int = 0,
    restarts: int = 0,
) -> dict[str, Any]:
    """``n`` two-turn conversations on a pair in bidirectional mode (:mod:`_vllm_turns`),
    the conversations ``first`` to ``first + n - 1`` (each number is its prompts).

    A conversation a server failed (an engine that died, a request past its timeout)
    is reported with the stacks the watchdog took (:mod:`_vllm_stall`); the pair is then
    stopped and, ``restarts`` times at most, started afresh for the same conversation."""
    p_conn, d_conn = PAIRS[name]
    tag = name.replace(" ", "_").replace("+", "") + "-2turn"
    traces = logs / f"{tag}-traces"  # every start's traces: check-trace reads them all
    rows: list[dict[str, Any]] = []
    i, started = first, 0
    while i < first + n and started <= restarts:
        run = tag if started == 0 else f"{tag}-restart{started}"
        started += 1
        p = server(model, "kv_producer", p_conn, logs / f"{run}-P.log", traces, bidirectional=True)
        d = server(model, "kv_consumer", d_conn, logs / f"{run}-D.log", traces, bidirectional=True)
        watchdog = Watchdog({"P": p, "D": d})
        try:
            p.wait_up()
            d.wait_up()
            while i < first + n:
                before = {side: metrics(s.port) for side, s in (("p", p), ("d", d))}
                stalls = len(watchdog.stalls)
                try:
                    t1, t2 = tokens(p.port, prompt(i, 60)), tokens(p.port, prompt(100 + i, 20))
                    row = two_turns(
                        partial(watched_post, watchdog, f"{run} conversation {i}"),
                        p_port=p.port,
                        d_port=d.port,
                        turn1=t1,
                        turn2=t2,
                        max_tokens=max_tokens,
                    )
                except (urllib.error.URLError, OSError) as exc:  # timeouts included
                    # a server that failed a request: the conversation is reported failed
                    # with where the engines were, and this pair is asked for no more
                    print(name, "two-turn", i, "failed:", repr(exc), flush=True)
                    rows.append(
                        {"failed": repr(exc), "conversation": i, "stalls": watchdog.stalls[stalls:]}
                    )
                    break
                for side, s in (("p", p), ("d", d)):
                    after = metrics(s.port)
                    row[f"{side}_counters"] = {
                        k: v - before[side].get(k, 0.0) for k, v in after.items() if v
                    }
                row["conversation"] = i
                row["stalls"] = watchdog.stalls[stalls:]  # slow, yet served
                print(name, "two-turn", i, row, flush=True)
                rows.append(row)
                i += 1
        finally:
            d.stop()
            p.stop()
    return {"conversations": rows, "starts": started, "trace": validate(traces)}


def run_latency(
    model: Path,
    logs: Path,
    rounds: int,
    verdict_wait: float | None = None,
    lease: int = LEASE,
    *,
    idle_wait: float | None = None,
    one_at_a_time: bool = False,
) -> dict[str, Any]:
    """D's leg on the stock pair and ours, interleaved (:mod:`_vllm_latency`);
    ``verdict_wait`` is our D's setting and ``idle_wait`` our P's (None: the
    default), ``lease`` every engine's ``kv_lease_duration``; ``one_at_a_time``:
    the pair not measured is stopped meanwhile."""
    names = ("stock", "leaseproto")
    servers: dict[str, tuple[Server, Server]] = {}
    traces = logs / "latency-traces"
    try:
        for name in names:
            p_conn, d_conn = PAIRS[name]
            tag = f"latency-{name}"
            ours = name == "leaseproto"
            p_more: dict[str, Any] = {"kv_lease_duration": lease}
            d_more = dict(p_more)
            if ours and verdict_wait is not None:
                d_more["verdict_wait"] = verdict_wait
            if ours and idle_wait is not None:
                p_more["idle_wait"] = idle_wait
            servers[name] = (
                server(model, "kv_producer", p_conn, logs / f"{tag}-P.log", traces, more=p_more),
                server(model, "kv_consumer", d_conn, logs / f"{tag}-D.log", traces, more=d_more),
            )
        for p, d in servers.values():
            p.wait_up()
            d.wait_up()
        our_engines = dict(zip(("p", "d"), servers["leaseproto"], strict=True))
        before = {side: metrics(s.port) for side, s in our_engines.items()}

        def focus(name: str | None) -> None:  # the others stopped, this one (or all) running
            for other, pair in servers.items():
                for s in pair:
                    s.pause(name is not None and other != name)

        res = d_leg_rounds(
            post,
            {n: (p.port, d.port) for n, (p, d) in servers.items()},
            [prompt(i) for i in range(rounds)],
            focus=focus if one_at_a_time else None,
        )
        time.sleep(2)  # two stats intervals
        after = {side: metrics(s.port) for side, s in our_engines.items()}
    finally:
        for p, d in servers.values():
            d.stop()
            p.stop()
    out = summarise(res, "stock")
    for side in ("p", "d"):  # our engines' counters over the rounds
        out[f"{side}_counters"] = {
            k: v - before[side].get(k, 0.0) for k, v in after[side].items() if "leaseproto" in k
        }
    out["raw"] = res
    out["trace"] = validate(traces)
    return out


def latency_table(res: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    header = (
        "pair",
        "requests",
        "D leg median ms",
        "p90 ms",
        "min-max ms",
        "vs stock (median)",
        "per-slice ratios",
        "P leg median ms",
    )
    out = []
    for name, r in res["pairs"].items():
        out.append(
            (
                name,
                r["n"],
                r["median_ms"],
                r["p90_ms"],
                f"{r['min_ms']}-{r['max_ms']}",
                "-" if "ratio" not in r else f"{r['ratio']:.2f}x",
                "-"
                if "ratio" not in r
                else f"{min(r['ratio_slices']):.2f}-{max(r['ratio_slices']):.2f}",
                r["p_leg_median_ms"],
            )
        )
    return header, out


def two_turn_table(turns: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """One row per pair: what the conversations gave, and what P and D counted."""

    def total(rows: list[dict[str, Any]], side: str, *names: str) -> int:
        return int(sum(r[f"{side}_counters"].get(n, 0.0) for r in rows for n in names))

    header = (
        "pair",
        "conversations",
        "turn 1 identical",
        "turn 2 identical",
        "D kept turn 1",
        "P: turn-2 reads verified",
        "P: reads refused/timed out",
        "P: expired leases",
        "P: late reads",
        "trace validation",
    )
    out = []
    for name, res in turns.items():
        failed = [r for r in res["conversations"] if "failed" in r]
        rows = [r for r in res["conversations"] if "failed" not in r]
        t = res.get("trace")
        stalls = sum(len(r.get("stalls", ())) for r in res["conversations"])
        out.append(
            (
                name,
                f"{len(rows)}"
                + (f" (+{len(failed)} failed)" if failed else "")
                + (f", {stalls} stalled" if stalls else ""),
                f"{sum(r['turn1_identical'] for r in rows)}/{len(rows)}",
                f"{sum(r['turn2_identical'] for r in rows)}/{len(rows)}",
                f"{sum(r['d_returned_blocks'] for r in rows)}/{len(rows)}",
                total(rows, "p", "vllm:leaseproto_reads_verified"),
                total(
                    rows,
                    "p",
                    "vllm:leaseproto_reads_refused",
                    "vllm:leaseproto_reads_verdict_timeout",
                ),
                total(rows, "p", "vllm:nixl_num_kv_expired_reqs"),
                total(rows, "p", "vllm:nixl_num_notifications_after_expiry"),
                "-" if t is None else f"{t['events']} events, {t['violations']} violations",
            )
        )
    return header, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument(
        "--two-turn", action="store_true", help="only two-turn conversations (bidirectional)"
    )
    ap.add_argument("--conversations", type=int, default=4, help="two-turn conversations per pair")
    ap.add_argument(
        "--first-conversation", type=int, default=0, help="number of the first conversation"
    )
    ap.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="two-turn: times a pair that failed a conversation is started afresh for it",
    )
    ap.add_argument(
        "--latency",
        action="store_true",
        help="only D's leg (READ + first token), stock and ours interleaved",
    )
    ap.add_argument("--rounds", type=int, default=60, help="requests per pair for --latency")
    ap.add_argument(
        "--verdict-wait",
        type=float,
        help="--latency: our D's verdict_wait in seconds (default: the connector's; 0: no wait)",
    )
    ap.add_argument(
        "--idle-wait",
        type=float,
        help="--latency: our P's idle_wait in seconds (default: the connector's; 0: no wait)",
    )
    ap.add_argument(
        "--one-pair-at-a-time",
        action="store_true",
        help="--latency: stop (SIGSTOP) the pair not measured while the other serves a request",
    )
    ap.add_argument(
        "--lease",
        type=int,
        default=LEASE,
        help=f"--latency: every engine's kv_lease_duration in s (default {LEASE}; at least 6)",
    )
    args = ap.parse_args()
    if args.lease < 6:  # vLLM's heartbeat interval would be 0 (our engines refuse it: rule V1)
        ap.error(f"--lease must be at least 6, got {args.lease}")
    die_with_parent()  # and each server with this process (_reaper)
    if args.latency:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
        model = build_tiny_model(work / "tiny-qwen3")
        res = run_latency(
            model,
            work,
            args.rounds,
            args.verdict_wait,
            args.lease,
            idle_wait=args.idle_wait,
            one_at_a_time=args.one_pair_at_a_time,
        )
        load = res["load"]
        res["one_pair_at_a_time"] = args.one_pair_at_a_time
        alone = "; the other pair stopped meanwhile" if args.one_pair_at_a_time else ""
        print(
            f"kv_lease_duration {args.lease} s; load {min(load):.1f}-{max(load):.1f}{alone}; "
            f"{machine()}"
        )
        print(table(*latency_table(res)))
        print(table(*verdict_table(res, args.verdict_wait, args.idle_wait)))
        print("leaseproto D counters:", res["d_counters"])
        print("leaseproto P counters:", res["p_counters"])
        if res["trace"] is not None:
            print("verdicts:", res["trace"].get("verdicts"))
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return
    if args.two_turn:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
        model = build_tiny_model(work / "tiny-qwen3")
        turns = {
            n: run_two_turns(
                n,
                model,
                work,
                args.conversations,
                args.max_tokens,
                first=args.first_conversation,
                restarts=args.restarts,
            )
            for n in args.pairs
        }
        print(f"kv_lease_duration {LEASE} s, bidirectional_kv_xfer; {machine()}")
        print(table(*two_turn_table(turns)))
        report_traces(turns, args.json)
        return

    work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
    model = build_tiny_model(work / "tiny-qwen3")
    results = {
        name: run_pair(name, model, work, args.requests, args.max_tokens) for name in args.pairs
    }
    header = (
        "pair",
        "phase",
        "requests",
        "identical",
        "wrong",
        "expired",
        "late reads (P)",
        "unverified (D)",
        "recomputed (D)",
        "kill -> last free s",
        "last grant -> last free s",
    )
    out = []
    for name, rows in results.items():
        for phase in ("surge", "stall", "kill"):
            r = rows.get(phase)
            if r is None:
                continue
            free = r["kill_to_last_free_s"]
            out.append(
                (
                    name,
                    phase,
                    r["requests"],
                    f"{r['identical']}/{r['completed']}",
                    r["wrong"],
                    r["expired"],
                    r["late_reads"],
                    "-" if r["unverified"] is None else r["unverified"],
                    "-" if r["recomputed"] is None else r["recomputed"],
                    "-" if free is None else str(free),
                    "-"
                    if r.get("last_grant_to_last_free_s") is None
                    else f"{r['last_grant_to_last_free_s']} (bound {r['bound_s']})",
                )
            )
    print(f"kv_lease_duration {LEASE} s; {machine()}")
    print(table(header, out))
    report_traces(results, args.json)


if __name__ == "__main__":
    main()
