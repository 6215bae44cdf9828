"""Helpers shared by the benchmark scripts: machine description, tables, stats."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def machine() -> str:
    """``"<cpu model>, <n> cores, Python x.y.z"`` from /proc/cpuinfo where it exists."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, Python {platform.python_version()}"


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (readable as plain text too)."""
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def us(seconds: float) -> str:
    """Seconds as microseconds with sensible precision."""
    v = seconds * 1e6
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def ratio(a: float, b: float) -> str:
    if b <= 0:
        return "-"
    r = a / b
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def load() -> str:
    """The machine's 1/5/15-minute load averages, for the tables' captions."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load unknown"
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def interleaved(
    sides: Sequence[Callable[[], object]], *, number: int, repeat: int
) -> list[tuple[float, float]]:
    """Per side, ``(thread CPU seconds, wall seconds)`` per call, each the best
    of ``repeat`` batches of ``number`` calls. The sides take turns batch by
    batch (the order alternating), so load from elsewhere on a shared machine
    falls on all of them alike; thread CPU time (``time.thread_time_ns``)
    leaves out the time other processes take the core."""
    cpu = [float("inf")] * len(sides)
    wall = [float("inf")] * len(sides)
    order = list(range(len(sides)))
    for r in range(repeat):
        for k in order if r % 2 == 0 else reversed(order):
            fn = sides[k]
            w0 = time.perf_counter_ns()
            c0 = time.thread_time_ns()
            for _ in range(number):
                fn()
            c1 = time.thread_time_ns()
            w1 = time.perf_counter_ns()
            cpu[k] = min(cpu[k], (c1 - c0) * 1e-9 / number)
            wall[k] = min(wall[k], (w1 - w0) * 1e-9 / number)
    return list(zip(cpu, wall, strict=True))
