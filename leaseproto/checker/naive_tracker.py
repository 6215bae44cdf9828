"""A naive model of the decode side's tracking (spec §7.1-7.3, §3.4): one dict of
requests, one of engines, a full scan on every step.

Written from the spec's prose and state machines, without the rules of
:mod:`leaseproto.core.rules` or the tracker's queues, thresholds and fast paths, so
that ``leaseproto prove`` (``proofs/tracking.py``, lemma L16) can hold the real
:class:`~leaseproto.HeartbeatTracker` to it. Slow on purpose. Misuse (spec §10: an
id that cannot go on the wire, one tracked twice, a ``now`` that is not a finite
number or went back) raises :class:`~leaseproto.core.errors.LocalProtocolError`
and changes nothing, as the tracker does.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any

from ..core.config import LeaseConfig
from ..core.errors import LocalProtocolError
from .naive_wire import id_ok, longest_id, pack_heartbeat

__all__ = ["NaiveTracker"]


def _is_time(now: object) -> bool:
    """A finite number, not a bool; a real number of another type (the proofs' symbolic
    times register as :class:`numbers.Real`) is taken as a finite real."""
    if isinstance(now, bool):
        return False
    if isinstance(now, (int, float)):
        return math.isfinite(now)
    return isinstance(now, numbers.Real)


class NaiveTracker:
    """Same API and return values as :class:`~leaseproto.HeartbeatTracker`."""

    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        #: local id -> (engine, P's id), in tracking order
        self.requests: dict[str, tuple[str, str]] = {}
        #: engine -> the ``now`` of its last heartbeat (None: never), in the order the
        #: engines were first tracked (an engine forgotten and tracked again is new)
        self.last: dict[str, Any] = {}
        self.now: Any = None
        self.counts = dict.fromkeys(
            ("tracked", "untracked", "heartbeats", "heartbeat_ids", "deferred", "dropped"), 0
        )

    def _clock(self, now: Any) -> None:
        if not _is_time(now) or (self.now is not None and now < self.now):
            raise LocalProtocolError(f"now={now!r} is not a time after {self.now!r}")

    def track(
        self, req_id: str, *, engine_id: str, remote_req_id: str | None = None, now: float
    ) -> None:
        remote = req_id if remote_req_id is None else remote_req_id
        if not id_ok(remote) or len(remote.encode()) > longest_id(
            self.config.max_notification_bytes
        ):
            raise LocalProtocolError(f"id {remote!r} cannot go on the wire")
        if not isinstance(req_id, str) or req_id in self.requests:
            raise LocalProtocolError(f"request {req_id!r} is not a new str")
        self._clock(now)
        self.now = now
        if engine_id not in self.last:
            self.last[engine_id] = None  # due at once
        self.requests[req_id] = (engine_id, remote)
        self.counts["tracked"] += 1

    def _forget_if_idle(self, engine: str) -> None:
        if all(e != engine for e, _ in self.requests.values()):
            del self.last[engine]

    def untrack(self, req_id: str) -> None:
        if req_id in self.requests:
            engine, _ = self.requests.pop(req_id)
            self.counts["untracked"] += 1
            self._forget_if_idle(engine)

    def drop_engine(self, engine_id: str) -> list[str]:
        gone = [r for r, (e, _) in self.requests.items() if e == engine_id]
        for r in gone:
            del self.requests[r]
        self.last.pop(engine_id, None)
        self.counts["dropped"] += len(gone)
        return gone

    def due(self, *, now: float, pending: Collection[str] = ()) -> dict[str, list[str]]:
        """Every engine that never had a heartbeat, or whose last one is at least
        ``heartbeat_interval`` old, in the engines' order; those in ``pending`` keep
        their turn; the others are sent to now."""
        self._clock(now)
        self.now = now
        out: dict[str, list[str]] = {}
        for engine, last in self.last.items():
            if last is not None and not now - last >= self.config.heartbeat_interval:
                continue
            if engine in pending:
                self.counts["deferred"] += 1
                continue
            out[engine] = [p for e, p in self.requests.values() if e == engine]
        for engine in out:
            self.last[engine] = now
        self.counts["heartbeats"] += len(out)
        self.counts["heartbeat_ids"] += sum(len(v) for v in out.values())
        return out

    def next_due(self) -> Any:
        """None with no engine; -inf while one never had a heartbeat; else the
        earliest ``last + heartbeat_interval``."""
        if not self.last:
            return None
        if any(last is None for last in self.last.values()):
            return -math.inf
        return min(last + self.config.heartbeat_interval for last in self.last.values())

    def payloads(self, ids: list[str], *, max_bytes: int | None = None) -> list[bytes]:
        size = self.config.max_notification_bytes if max_bytes is None else max_bytes
        return pack_heartbeat(ids, size)

    def engines(self) -> list[str]:
        return list(self.last)

    def engine_of(self, req_id: str) -> str | None:
        return self.requests[req_id][0] if req_id in self.requests else None

    def remote_id(self, req_id: str) -> str | None:
        return self.requests[req_id][1] if req_id in self.requests else None

    def request_ids(self, engine_id: str) -> list[str]:
        return [r for r, (e, _) in self.requests.items() if e == engine_id]

    def stats(self) -> dict[str, int]:
        """The counters of ``TrackerStats``, by name."""
        return {**self.counts, "live": len(self.requests), "engines": len(self.last)}
