"""D's leg, stock against ours, interleaved (``benchmarks/vllm_pd.py --latency``).

Both pairs run at once (stock P and D, ``LeaseprotoConnector`` P and D); requests
go one at a time, alternating between the pairs in ABBA order, so a change of
load on the shared machine moves both sides alike. Each request is routed as
vLLM's toy proxy does (prefill on P with ``do_remote_decode``, then D with P's
``kv_transfer_params``); *D's leg* is the wall time of D's completion with
``max_tokens`` 1: its READ of P's blocks, the verdict wait (ours), and the first
token. The ratio is ours / stock of the medians; its spread is the ratio of the
medians within each of ``blocks`` consecutive slices of the run (min-max)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from leaseproto.integrations.vllm.idle import DEFAULT_IDLE_WAIT
from leaseproto.integrations.vllm.verify import DEFAULT_VERDICT_WAIT

__all__ = [
    "PREFILL",
    "completion",
    "d_leg_rounds",
    "latency_table",
    "summarise",
    "verdict_table",
]

Post = Callable[[int, dict[str, Any]], dict[str, Any]]


#: the kv_transfer_params of a prefill on P whose KV D reads (vLLM's toy proxy)
PREFILL = {"do_remote_decode": True, "do_remote_prefill": False}


def completion(text: str, params: dict[str, Any], max_tokens: int = 1) -> dict[str, Any]:
    """A greedy completion request with ``params`` as its kv_transfer_params."""
    return {
        "model": "m",
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": 0,
        "kv_transfer_params": params,
    }


def _leg(post: Post, p_port: int, d_port: int, text: str) -> tuple[float, float, str]:
    """One request through a pair: (P's leg s, D's leg s, D's first token)."""
    t0 = time.perf_counter()
    first = post(p_port, completion(text, PREFILL))
    t1 = time.perf_counter()
    out = post(d_port, completion(text, first["kv_transfer_params"]))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, str(out["choices"][0]["text"])


def d_leg_rounds(
    post: Post,
    pairs: dict[str, tuple[int, int]],
    prompts: list[str],
    *,
    warmup: int = 3,
    focus: Callable[[str | None], None] | None = None,
) -> dict[str, Any]:
    """Each prompt through every pair (``name -> (p_port, d_port)``), the pairs'
    order alternating ABBA; the first ``warmup`` prompts are not counted.
    ``focus(name)`` is called before each request to that pair, ``focus(None)``
    at the end."""
    names = list(pairs)
    legs: dict[str, list[float]] = {n: [] for n in names}
    p_legs: dict[str, list[float]] = {n: [] for n in names}
    tokens: dict[str, list[str]] = {n: [] for n in names}
    load = [os.getloadavg()[0]]
    for i, text in enumerate(prompts):
        order = names if (i // 2) % 2 == 0 else names[::-1]  # A B, B A, A B, ...
        for name in order:
            if focus is not None:
                focus(name)
            p_s, d_s, tok = _leg(post, *pairs[name], text)
            if i >= warmup:
                legs[name].append(d_s)
                p_legs[name].append(p_s)
                tokens[name].append(tok)
        if i % 10 == 0:
            load.append(os.getloadavg()[0])
    if focus is not None:
        focus(None)
    load.append(os.getloadavg()[0])
    return {"d_leg_s": legs, "p_leg_s": p_legs, "tokens": tokens, "load": load}


def summarise(res: dict[str, Any], base: str, blocks: int = 5) -> dict[str, Any]:
    """Per pair: D's leg median, min, max, p90 (ms); ours / ``base`` of the medians,
    with the min-max of that ratio over ``blocks`` slices of the run."""
    legs: dict[str, list[float]] = res["d_leg_s"]
    out: dict[str, Any] = {"pairs": {}, "load": res["load"]}
    for name, xs in legs.items():
        s = sorted(xs)
        out["pairs"][name] = {
            "n": len(s),
            "median_ms": round(1e3 * statistics.median(s), 2),
            "p90_ms": round(1e3 * s[min(len(s) - 1, int(0.9 * len(s)))], 2),
            "min_ms": round(1e3 * s[0], 2),
            "max_ms": round(1e3 * s[-1], 2),
            "p_leg_median_ms": round(1e3 * statistics.median(res["p_leg_s"][name]), 2),
        }
    ref = legs[base]
    n = len(ref)
    size = max(1, n // blocks)
    for name, xs in legs.items():
        if name == base:
            continue
        slices = [
            statistics.median(xs[k : k + size]) / statistics.median(ref[k : k + size])
            for k in range(0, n - size + 1, size)
        ]
        out["pairs"][name]["ratio"] = round(statistics.median(xs) / statistics.median(ref), 3)
        out["pairs"][name]["ratio_slices"] = [round(r, 3) for r in slices]
        same = sum(a == b for a, b in zip(res["tokens"][name], res["tokens"][base], strict=True))
        out["pairs"][name]["same_first_token"] = f"{same}/{n}"
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


def verdict_table(
    res: dict[str, Any], verdict_wait: float | None, idle_wait: float | None = None
) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """One row for our pair: what its D's ``verdict_wait`` and its P's ``idle_wait``
    did (their counters) and the verdict path's medians from check-trace, beside D's
    leg against stock."""
    header = (
        "verdict_wait",
        "idle_wait",
        "load",
        "vs stock (median)",
        "per-slice ratios",
        "waits (missed)",
        "OK sent to D's poll, median ms",
        "READ to use, median ms",
        "READ to P's poll, median ms",
        "READ to P's poll, max ms",
        "verdict timeouts",
        "P idle waits",
    )
    ours = res["pairs"]["leaseproto"]
    counters = res["d_counters"]
    paths = (res.get("trace") or {}).get("verdicts") or {}

    def ms(key: str, which: str = "median") -> str:
        got = paths.get(key) or {}
        return "-" if got.get(which) is None else f"{1e3 * got[which]:.1f}"

    waits = counters.get("vllm:leaseproto_verdict_waits", 0.0)
    missed = counters.get("vllm:leaseproto_verdict_waits_missed", 0.0)
    wait = (
        f"{DEFAULT_VERDICT_WAIT:g} s (default)" if verdict_wait is None else f"{verdict_wait:g} s"
    )
    idle = f"{DEFAULT_IDLE_WAIT:g} s (default)" if idle_wait is None else f"{idle_wait:g} s"
    p_counters = res.get("p_counters") or {}
    row = (
        wait,
        idle,
        f"{min(res['load']):.1f}-{max(res['load']):.1f}",
        f"{ours['ratio']:.2f}x",
        f"{min(ours['ratio_slices']):.2f}-{max(ours['ratio_slices']):.2f}",
        f"{waits:.0f} ({missed:.0f})",
        ms("to_d_poll"),
        ms("read_to_use"),
        ms("to_p_poll"),
        ms("to_p_poll", "max"),
        f"{counters.get('vllm:leaseproto_reads_verdict_timeout', 0.0):.0f}",
        f"{p_counters.get('vllm:leaseproto_idle_waits', 0.0):.0f}",
    )
    return header, [row]
