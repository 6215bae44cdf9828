"""Run several policies on one workload, side by side.

This is the only part of the simulator that reads the wall clock, and only to
report how long a run took and to pace the progress bar.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from .figures import Figures, Series
from .fleet import FleetRun
from .policy import Policy, default_policies
from .workload import Scenario, Workload, generate

__all__ = ["Comparison", "Progress", "compare"]


class Progress:
    """A progress bar on a terminal (``rich``), one task per policy:
    ``lease 3/4 ━━━━━━━━━╸━━━━━━  61% virtual t=549s``, fitted to the
    terminal's width and cleared when the comparison ends.

    Needs ``rich`` (the ``serve`` extra); :func:`available` says whether it is
    installed. On a stream that is not a terminal it draws nothing.
    """

    def __init__(self, stream: TextIO | None = None, every: float = 0.2) -> None:
        from rich.console import Console  # noqa: PLC0415 - optional
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            TaskProgressColumn,
            TextColumn,
        )
        from rich.progress import Progress as Bar  # noqa: PLC0415

        console = Console(file=stream if stream is not None else sys.stderr)
        self._bar = Bar(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=None),
            TaskProgressColumn(),
            TextColumn("virtual t={task.completed:,.0f}s"),
            console=console,
            transient=True,
            refresh_per_second=max(1.0, 1.0 / every),
        )
        self._task: Any = None

    @staticmethod
    def available() -> bool:
        """Whether ``rich`` is installed."""
        import importlib.util  # noqa: PLC0415

        return importlib.util.find_spec("rich") is not None

    def start(self, label: str, total: float) -> None:
        if self._task is None:
            self._bar.start()
        else:
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task(label, total=max(total, 1e-9))

    def update(self, t: float) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=t)

    def done(self) -> None:
        if self._task is not None:
            self._bar.stop()
            self._task = None


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
