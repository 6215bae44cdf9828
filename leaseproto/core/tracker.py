"""The decode side: which P leases D must keep alive (spec §7, §8.6).

D tracks a request from the moment it enters the waiting queue, not when it is
scheduled: under load the wait is unbounded, and only heartbeats keep P's
blocks alive meanwhile. Heartbeats are batched per P engine: one message (or
as few as ``max_notification_bytes`` allows) names every tracked request of
that engine.

Each engine has its own timer. An engine is *due* when it never had a
heartbeat or its last one is ``heartbeat_interval`` old. ``due`` marks what it
returns as sent; an engine the caller cannot send to yet (handshake pending) is
passed in ``pending`` and keeps its turn, so its heartbeat goes out on the first
step after the handshake completes, not an interval later (upstream lost that
turn, spec §11).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from . import rules as R
from .checks import FIRST_NOW, advance, check_wire_id
from .config import LeaseConfig
from .errors import LocalProtocolError

__all__ = ["HeartbeatTracker", "TrackerStats"]


@dataclass(frozen=True, slots=True)
class TrackerStats:
    """Counters of a :class:`HeartbeatTracker` since it was made."""

    tracked: int = 0
    untracked: int = 0
    #: (engine, step) pairs returned by :meth:`HeartbeatTracker.due`
    heartbeats: int = 0
    #: request ids carried by those heartbeats
    heartbeat_ids: int = 0
    #: due engines held back because their handshake was pending
    deferred: int = 0
    #: requests dropped with their engine (peer lost)
    dropped: int = 0
    #: requests tracked now
    live: int = 0
    #: engines with tracked requests now
    engines: int = 0


class HeartbeatTracker:
    """D's heartbeat schedule. Owns no clock: time-dependent calls take ``now``."""

    def __init__(self, config: LeaseConfig | None = None) -> None:
        self.config = config if config is not None else LeaseConfig()
        # engine -> {local id: remote id}, in tracking order
        self._by_engine: dict[str, dict[str, str]] = {}
        # local id -> engine
        self._engine_of: dict[str, str] = {}
        # engine -> now of its last heartbeat
        self._last_sent: dict[str, float] = {}
        # the oldest last heartbeat of any engine, or None when some engine
        # never had one (or may be pending): a lower bound that lets a step in
        # which nothing is due return at once (heartbeat_due is monotone in it)
        self._oldest: float | None = None
        self._last_now = FIRST_NOW
        self._c = {
            "tracked": 0,
            "untracked": 0,
            "heartbeats": 0,
            "heartbeat_ids": 0,
            "deferred": 0,
            "dropped": 0,
        }

    def _clock(self, now: float) -> None:
        self._last_now = advance(self._last_now, now)

    def track(
        self, req_id: str, *, engine_id: str, remote_req_id: str | None = None, now: float
    ) -> None:
        """Start heartbeating P's lease for ``req_id`` (call on entering the
        waiting queue). ``remote_req_id`` is P's id (default ``req_id``).

        Raises:
            LocalProtocolError: ``req_id`` is already tracked; the id that goes
                on the wire (``remote_req_id``, else ``req_id``) cannot
                (:func:`leaseproto.wire.check_id`, or longer than
                ``config.max_id_bytes``: rule C7); ``now`` is not finite or went
                back. Nothing changes.
        """
        remote = req_id if remote_req_id is None else remote_req_id
        check_wire_id(remote, self.config.max_id_bytes)
        if not isinstance(req_id, str):
            raise LocalProtocolError(f"request id must be a str, got {type(req_id).__name__}")
        if req_id in self._engine_of:
            raise LocalProtocolError(
                f"request {req_id!r} is already tracked (engine {self._engine_of[req_id]!r})"
            )
        self._clock(now)
        if engine_id not in self._by_engine:
            self._oldest = None  # a new engine is due at once
        self._by_engine.setdefault(engine_id, {})[req_id] = remote
        self._engine_of[req_id] = engine_id
        self._c["tracked"] += 1

    def untrack(self, req_id: str) -> None:
        """Stop heartbeating ``req_id`` (transfer done, finished, aborted, or
        no longer needs a transfer). Unknown ids are a no-op."""
        engine = self._engine_of.pop(req_id, None)
        if engine is None:
            return
        reqs = self._by_engine[engine]
        del reqs[req_id]
        if not reqs:
            del self._by_engine[engine]
            self._last_sent.pop(engine, None)
        self._c["untracked"] += 1

    def drop_engine(self, engine_id: str) -> list[str]:
        """Forget every request of ``engine_id`` (its P is gone: the caller fails
        them over to recompute or an error). Returns their local ids."""
        reqs = self._by_engine.pop(engine_id, {})
        self._last_sent.pop(engine_id, None)
        for rid in reqs:
            del self._engine_of[rid]
        self._c["dropped"] += len(reqs)
        return list(reqs)

    def due(self, *, now: float, pending: Collection[str] = ()) -> dict[str, list[str]]:
        """The heartbeats to send now: engine id -> P's ids of its tracked
        requests, for each engine that never had a heartbeat or whose last one
        is at least ``heartbeat_interval`` old. Returned engines are marked as
        sent at ``now``. Engines in ``pending`` (not connected yet) are left
        out and keep their turn.
        """
        self._clock(now)
        interval = self.config.heartbeat_interval
        oldest = self._oldest
        if oldest is not None and not R.heartbeat_due(oldest, now, interval):
            return {}  # no engine's last heartbeat is as old as the oldest one
        out: dict[str, list[str]] = {}
        for engine, reqs in self._by_engine.items():
            last = self._last_sent.get(engine)
            if last is not None and not R.heartbeat_due(last, now, interval):
                continue
            if engine in pending:
                self._c["deferred"] += 1
                continue
            out[engine] = list(reqs.values())
            self._last_sent[engine] = now
        self._c["heartbeats"] += len(out)
        self._c["heartbeat_ids"] += sum(len(v) for v in out.values())
        # untracked engines leave _last_sent, so equal sizes mean every engine had one
        lasts = self._last_sent
        self._oldest = min(lasts.values()) if lasts and len(lasts) == len(self._by_engine) else None
        return out

    def next_due(self) -> float | None:
        """When the next heartbeat falls due (``-inf`` if one is due now)."""
        if not self._by_engine:
            return None
        interval = self.config.heartbeat_interval
        return min(self._last_sent.get(e, -math.inf) + interval for e in self._by_engine)

    # -- queries --------------------------------------------------------------------------
    def engines(self) -> list[str]:
        """Engines with tracked requests (the ones D must be connected to)."""
        return list(self._by_engine)

    def engine_of(self, req_id: str) -> str | None:
        return self._engine_of.get(req_id)

    def remote_id(self, req_id: str) -> str | None:
        engine = self._engine_of.get(req_id)
        return None if engine is None else self._by_engine[engine][req_id]

    def requests(self, engine_id: str) -> list[str]:
        """Local ids tracked for ``engine_id``."""
        return list(self._by_engine.get(engine_id, ()))

    @property
    def stats(self) -> TrackerStats:
        return TrackerStats(**self._c, live=len(self._engine_of), engines=len(self._by_engine))

    def __len__(self) -> int:
        return len(self._engine_of)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._engine_of
