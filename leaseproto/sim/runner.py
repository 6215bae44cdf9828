"""Run several policies on one workload, side by side.

This is the only part of the simulator that reads the wall clock, and only to
report how long a run took and to pace the progress bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from .figures import Figures, Series
from .fleet import FleetRun
from .policy import Policy, default_policies
from .workload import Scenario, Workload, generate

__all__ = ["Comparison", "Progress", "compare"]


class Progress:
    """A one-line progress bar on a stream, redrawn at most every ``every`` s
    of wall time: ``[policy 2/4] ######.... 61% virtual t=549s``."""

    def __init__(self, stream: TextIO | None = None, every: float = 0.2, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.width = width
        self._last = 0.0
        self._label = ""
        self._total = 1.0

    def start(self, label: str, total: float) -> None:
        self._label = label
        self._total = total
        self._last = 0.0
        self.update(0.0)

    def update(self, t: float) -> None:
        now = time.monotonic()
        if now - self._last < self.every and t > 0.0:
            return
        self._last = now
        frac = min(1.0, t / self._total) if self._total > 0 else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self._label} {bar} {frac:4.0%} virtual t={t:,.0f}s ")
        self.stream.flush()

    def done(self) -> None:
        self.stream.write("\r" + " " * (len(self._label) + self.width + 40) + "\r")
        self.stream.flush()


@dataclass
class Comparison:
    """Every policy's figures and series on one workload."""

    scenario: Scenario
    seed: int
    policies: list[Policy]
    figures: list[Figures] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    runs: list[FleetRun] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def workload_size(self) -> int:
        return self.figures[0].requests if self.figures else 0


def compare(
    scenario: Scenario,
    *,
    seed: int = 0,
    policies: Sequence[Policy] | None = None,
    sample_dt: float | None = None,
    progress: Progress | None = None,
    workload: Workload | None = None,
) -> Comparison:
    """Generate ``scenario``'s workload for ``seed`` once and run every policy
    on it (default: :func:`default_policies`)."""
    started = time.perf_counter()
    pols = list(policies) if policies is not None else default_policies()
    wl = workload if workload is not None else generate(scenario, seed)
    out = Comparison(scenario, seed, pols)
    for k, policy in enumerate(pols):
        if progress is not None:
            progress.start(f"[{policy.name} {k + 1}/{len(pols)}]", scenario.duration)
        run = FleetRun(
            wl,
            policy,
            sample_dt=sample_dt,
            progress=progress.update if progress is not None else None,
        )
        t0 = time.perf_counter()
        fig, series = run.run()
        fig.wall_s = time.perf_counter() - t0
        out.figures.append(fig)
        out.series.append(series)
        out.runs.append(run)
    if progress is not None:
        progress.done()
    out.wall_s = time.perf_counter() - started
    return out
