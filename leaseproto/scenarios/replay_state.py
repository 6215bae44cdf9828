"""The state a replay runs on (spec §12): the ranks of each grantor engine with
their real :class:`~leaseproto.LeaseTable`, the reader's real
:class:`~leaseproto.HeartbeatTracker`, the virtual timeline and its message
queue, and what happened so far as :class:`Event` values. :mod:`.replay` drives
it line by line and :mod:`.expect` reads it; owns no clock: each side's ``now``
is its clock's reading at ``t``. The grantor is P, or D in a mirrored world
(header ``"grantor": "D"``, spec §2.8): ``G`` and ``R`` name the two sides.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from ..core.events import Release
from ..core.table import LeaseTable
from ..core.tracker import HeartbeatTracker
from .format import MIRRORED, Engine, Scenario, ScenarioError

__all__ = ["TOL", "Event", "Rank", "ReplayResult", "World"]

#: Tolerance for comparing instants of the virtual timeline.
TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Event:
    """One thing the reference implementation did."""

    t: float
    where: str
    kind: str
    text: str
    line: int = 0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ReplayResult:
    name: str
    events: list[Event]
    expects_ok: int = 0
    expects_failed: int = 0
    #: the line that stopped the replay (misuse such as granting a live id)
    error: ScenarioError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.expects_failed == 0


class Rank:
    def __init__(self, name: str, engine: Engine, table: LeaseTable) -> None:
        self.name = name
        self.engine = engine
        self.table = table
        self.inbox: list[tuple[bytes, float, int]] = []  # payload, sent at, line
        self.releases: dict[str, tuple[str, float]] = {}
        self.nacks: list[str] = []
        self.malformed = 0
        #: per lease: the deadline exported at the grant, the verdict on the last
        #: transfer-done handled, the instant ``t`` of its release
        self.exported: dict[str, float] = {}
        self.verdicts: dict[str, str] = {}
        self.freed_t: dict[str, float] = {}


def fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.3f}"


def show(payload: bytes) -> str:
    text = payload.decode("utf-8", errors="backslashreplace")
    return text if len(text) <= 72 else f"{text[:60]}... ({len(payload)} bytes)"


class World:
    def __init__(self, scenario: Scenario) -> None:
        h = scenario.header
        self.h = h
        self.cfg = h.config
        self.G = h.grantor
        self.R = "P" if h.grantor == "D" else "D"
        self.clock = {side: (rate, off) for side, rate, off in h.clocks}
        self.ranks: dict[str, list[Rank]] = {}
        for e in h.engines:
            self.ranks[e.name] = [
                Rank(e.name if e.tp == 1 else f"{e.name}/{i}", e, LeaseTable(self.cfg))
                for i in range(e.tp)
            ]
        self.engines = {e.name: e for e in h.engines}
        self.tracker: HeartbeatTracker | None = HeartbeatTracker(self.cfg)
        self.crashed_at = 0
        self.connected: set[str] = set()
        self.handshake_done: dict[str, float] = {}
        self.events: list[Event] = []
        self.result = ReplayResult(h.name, self.events)
        #: when the reader sent each transfer-done (its READ had completed then), and
        #: what each ``use`` line found
        self.read_done: dict[str, float] = {}
        self.uses: dict[str, list[str]] = {}
        self.queue: list[tuple[float, int, int, int, Any]] = []  # t, prio, line, seq, item
        self.seq = itertools.count()
        for op in scenario.ops:
            self._push(op.t, 1, op.line, (op, 0))
        self.t = 0.0
        self.line = 0

    # -- helpers --------------------------------------------------------------------------
    def _push(self, t: float, prio: int, order: int, item: Any) -> None:
        heapq.heappush(self.queue, (t, prio, order, next(self.seq), item))

    def _now(self, side: str, t: float | None = None) -> float:
        """``side``'s clock at ``t`` (default: now)."""
        rate, off = self.clock[side]
        return off + rate * (self.t if t is None else t)

    def written(self, name: str) -> str:
        """An op or ``expect`` name as this world's scenarios write it."""
        if self.G != "D":
            return name
        return next((k for k, v in MIRRORED.items() if v == name), name)

    def _emit(self, where: str, kind: str, text: str, **data: Any) -> None:
        if self.clock[self.G] != (1.0, 0.0) and where in self._names():
            text += f"  [{self.G} clock {self._now(self.G):.3f}]"
        self.events.append(Event(self.t, where, kind, text, self.line, data))

    def _names(self) -> set[str]:
        return {r.name for rs in self.ranks.values() for r in rs}

    def _select(self, engine: str | None, rank: int | None) -> list[Rank]:
        if engine is None:
            return [r for rs in self.ranks.values() for r in rs]
        rs = self.ranks[engine]
        return rs if rank is None else [rs[rank]]

    def _d(self) -> HeartbeatTracker:
        if self.tracker is None:
            raise ScenarioError(
                self.line,
                f"{self.R} is down (crashed at line {self.crashed_at}); add a "
                f"{self.written('d_restart')} line first",
            )
        return self.tracker

    def _release(self, rank: Rank, rel: Release, how: str = "") -> None:
        rank.releases[rel.req_id] = (rel.reason.value, rel.at)
        rank.freed_t[rel.req_id] = self.t
        self._emit(
            rank.name,
            "release",
            f"release {rel.req_id}: {rel.reason.value}{how} (granted {fmt(rel.granted_at)}, "
            f"deadline {fmt(rel.deadline)}, last renewal {fmt(rel.last_renewal)})",
            id=rel.req_id,
            reason=rel.reason.value,
            at=rel.at,
            granted_at=rel.granted_at,
            deadline=rel.deadline,
            last_renewal=rel.last_renewal,
        )

    def tracked(self) -> list[str]:
        tr = self.tracker
        if tr is None:
            return []
        return sorted(rid for e in tr.engines() for rid in tr.requests(e))
