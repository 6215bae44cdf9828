"""The runs of ``benchmarks/vllm_pd.py`` on real vLLM servers: the surge, stall and
kill schedule on one pair (the default), two-turn conversations (``--two-turn``), and
D's leg on the stock pair and ours, interleaved (``--latency``)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
from functools import partial
from pathlib import Path
from typing import Any

from _vllm_latency import PREFILL, completion, d_leg_rounds, summarise
from _vllm_pairs import PAIRS, metrics, post, prompt, references, server
from _vllm_server import LEASE, Server
from _vllm_stall import STALL_S, Watchdog
from _vllm_traces import validate
from _vllm_turns import tokens, two_turns

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
        ref = references(p.port, n, max_tokens)
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
