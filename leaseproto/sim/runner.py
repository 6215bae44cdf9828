"""Run several policies on one workload, side by side.

This is the only part of the simulator that reads the wall clock, and only to
report how long a run took and to pace the progress bar.
"""

from __future__ import annotations

import multiprocessing
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
    #: the runs themselves (their per-request records), when asked to keep them
    runs: list[FleetRun] = field(default_factory=list)
    wall_s: float = 0.0
    #: CPU seconds of the policies' runs, all processes together
    cpu_s: float = 0.0

    @property
    def workload_size(self) -> int:
        return self.figures[0].requests if self.figures else 0


def _run_one(
    wl: Workload, policy: Policy, sample_dt: float | None, progress: Progress | None
) -> tuple[FleetRun, Figures, Series]:
    run = FleetRun(
        wl, policy, sample_dt=sample_dt, progress=progress.update if progress is not None else None
    )
    t0, c0 = time.perf_counter(), time.process_time()
    fig, series = run.run()
    fig.wall_s = time.perf_counter() - t0
    fig.cpu_s = time.process_time() - c0
    return run, fig, series


# What a forked worker of compare(jobs > 1) runs: set before the pool forks, so the
# workload is inherited rather than pickled.
_JOB: tuple[Workload, list[Policy], float | None] | None = None


def _in_worker(k: int) -> tuple[Figures, Series]:
    assert _JOB is not None
    wl, pols, sample_dt = _JOB
    _, fig, series = _run_one(wl, pols[k], sample_dt, None)
    return fig, series


def compare(
    scenario: Scenario,
    *,
    seed: int = 0,
    policies: Sequence[Policy] | None = None,
    sample_dt: float | None = None,
    progress: Progress | None = None,
    workload: Workload | None = None,
    jobs: int = 1,
    keep_runs: bool = True,
) -> Comparison:
    """Generate ``scenario``'s workload for ``seed`` once and run every policy
    on it (default: :func:`default_policies`).

    ``jobs`` > 1 runs the policies in that many forked processes (no progress
    bar, and no :attr:`Comparison.runs`); the figures are the same as in one
    process. ``keep_runs=False`` drops each run's per-request records once its
    figures are taken (what a large preset needs to stay within memory).
    """
    global _JOB  # noqa: PLW0603 - handed to the forked workers
    started = time.perf_counter()
    pols = list(policies) if policies is not None else default_policies()
    wl = workload if workload is not None else generate(scenario, seed)
    out = Comparison(scenario, seed, pols)
    if jobs > 1 and len(pols) > 1:
        _JOB = (wl, pols, sample_dt)
        try:
            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(jobs, len(pols))) as pool:
                for fig, series in pool.imap(_in_worker, range(len(pols))):
                    out.figures.append(fig)
                    out.series.append(series)
        finally:
            _JOB = None
    else:
        for k, policy in enumerate(pols):
            if progress is not None:
                progress.start(f"[{policy.name} {k + 1}/{len(pols)}]", scenario.duration)
            run, fig, series = _run_one(wl, policy, sample_dt, progress)
            out.figures.append(fig)
            out.series.append(series)
            if keep_runs:
                out.runs.append(run)
            del run
        if progress is not None:
            progress.done()
    out.cpu_s = sum(f.cpu_s for f in out.figures)
    out.wall_s = time.perf_counter() - started
    return out
