"""The engines of a simulated fleet: their state, and their step grids."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque

from ..core.table import LeaseTable
from ..core.tracker import HeartbeatTracker
from .policy import Policy

__all__ = ["DEngine", "PEngine", "grid"]


def grid(t: float, period: float, phase: float) -> float:
    """The first step boundary ``phase + k * period`` at or after ``t``."""
    b = phase + math.ceil((t - phase) / period) * period
    return b if b >= t else b + period


class PEngine:
    __slots__ = ("busy", "expire_at", "index", "name", "phase", "queue", "table")

    def __init__(self, index: int, policy: Policy, phase: float) -> None:
        self.index = index
        self.name = f"prefill-{index}"
        self.table = LeaseTable(policy.config)
        self.queue: deque[int] = deque()
        self.busy = False
        self.phase = phase
        self.expire_at = math.inf


class DEngine:
    __slots__ = (
        "alive",
        "dead_since",
        "epoch",
        "gap",
        "hangs",
        "hb_times",
        "hs",
        "hs_wait",
        "index",
        "phase",
        "reading",
        "router_up",
        "running",
        "sched_times",
        "stall_ends",
        "stall_starts",
        "tracker",
        "waiting",
    )

    def __init__(
        self,
        index: int,
        phase: float,
        stalls: list[tuple[float, float]],
        hangs: list[tuple[float, float]],
    ) -> None:
        self.index = index
        self.hangs = hangs
        self.phase = phase
        self.stall_starts = [s for s, _ in stalls]
        self.stall_ends = [e for _, e in stalls]
        # the last gap between two stalls step_at found a boundary in: [end, next start]
        # (none yet: an empty interval)
        self.gap = (math.inf, -math.inf)
        self.alive = True
        self.router_up = True
        self.epoch = 0
        self.dead_since = math.nan
        self.tracker: HeartbeatTracker | None = None
        self.waiting: deque[int] = deque()
        self.reading: dict[int, None] = {}
        self.running = 0
        self.hs: dict[str, float] = {}  # P engine name -> handshake done at
        self.hs_wait: dict[str, float] = {}  # the part of hs not done yet (pruned as time passes)
        self.hb_times: set[float] = set()
        self.sched_times: set[float] = set()

    def step_at(self, t: float, period: float) -> float:
        """D's first step boundary at or after ``t``. A stall swallows the
        boundaries inside it: the stalled step ends at the stall's end."""
        phase = self.phase
        b = phase + math.ceil((t - phase) / period) * period  # grid(), written out
        if b < t:
            b += period
        lo, hi = self.gap
        if lo <= b <= hi:  # in the gap of the last call (most calls): in no stall
            return b
        starts = self.stall_starts
        ends = self.stall_ends
        i = bisect_right(starts, b) - 1  # the last stall that starts at or before b
        self.gap = (
            ends[i] if i >= 0 else -math.inf,
            starts[i + 1] if i + 1 < len(starts) else math.inf,
        )
        if i >= 0 and starts[i] < b < ends[i]:
            b = ends[i]
        return b
