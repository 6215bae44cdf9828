"""Three sides timed in turns, for ``benchmarks/bench_vllm.py``: leaseproto's core
("ours"), vLLM 0.32's own code and a hand-written floor, on the same input, each timed
with thread CPU time; and the ratios per repeat the report prints."""

from __future__ import annotations

import gc
import random
import statistics
from collections.abc import Callable, Sequence
from time import thread_time_ns

from leaseproto import LeaseConfig

CFG = LeaseConfig()
Side = Callable[[], float]  # runs one batch, returns its thread CPU ns per unit
Sidesets = dict[str, Side]


class Stub:
    """The ``self`` vLLM's methods are called on: just the attributes they read."""


def run(sides: dict[str, Side], repeat: int) -> dict[str, list[float]]:
    """Each side's per-unit ns in each repeat, the sides taking turns (order rotating)."""
    names = list(sides)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        gc.collect()
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(sides[name]())
    return out


def ids_(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)  # vLLM-shaped P ids, 54 bytes
    return [f"chatcmpl-{rng.getrandbits(128):032x}-{i:08x}" for i in range(n)]


def _cpu(fn: Callable[[], object], units: int) -> float:
    c0 = thread_time_ns()
    fn()
    return (thread_time_ns() - c0) / units


# -- the report -------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summarise(res: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    o, v, f = res["ours"], res["vllm"], res["floor"]
    return {
        "ours": spread(o),
        "vllm": spread(v),
        "floor": spread(f),
        "vs_vllm": spread([b / a for a, b in zip(o, v, strict=True)]),
        "of_floor": spread([b / a for a, b in zip(o, f, strict=True)]),
    }


def fmt_ns(t: tuple[float, float, float]) -> str:
    return (
        f"{t[1]:,.0f} ({t[0]:,.0f}-{t[2]:,.0f})"
        if t[1] >= 10
        else f"{t[1]:.1f} ({t[0]:.1f}-{t[2]:.1f})"
    )


def fmt_x(t: tuple[float, float, float]) -> str:
    return f"{t[1]:.2f}x ({t[0]:.2f}-{t[2]:.2f})"
