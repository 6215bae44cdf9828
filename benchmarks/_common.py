"""Helpers shared by the benchmark scripts: machine description, tables, stats."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Sequence
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
    return f"{a / b:.1f}x" if b > 0 else "-"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]
