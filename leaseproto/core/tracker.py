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
from . import wire
from .checks import FIRST_NOW, advance, check_wire_id
from .config import LeaseConfig
from .errors import LocalProtocolError
from .wire_ids import plain_id

__all__ = ["HeartbeatTracker", "TrackerStats"]

_INF = math.inf
_HB = wire.HEARTBEAT_PREFIX
_HB_LEN = len(_HB)


class _Requests(dict[str, int]):
    """One engine's tracked requests by the id P knows them by: remote id -> how many
    tracked requests name it (one, unless two local requests share P's id), in the
    order first named. So an engine's heartbeat names each id once, in tracking order,
    with no pass to drop repeats. Knows its engine."""

    __slots__ = ("engine",)

    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine


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
        self._max_id = self.config.max_id_bytes
        # engine -> {remote id: tracked requests naming it}, in tracking order
        self._by_engine: dict[str, _Requests] = {}
        # local id -> (its engine's requests, its remote id), in tracking order
        self._engine_of: dict[str, tuple[_Requests, str]] = {}
        # engine -> now of its last heartbeat, oldest first (an engine sent to
        # moves to the end, and ``now`` never decreases)
        self._last_sent: dict[str, float] = {}
        # engine -> its place in _by_engine's order, so a step that visits only
        # the due engines returns them in the order a full scan would
        self._order: dict[str, int] = {}
        # engines that never had a heartbeat, in tracking order
        self._unsent: dict[str, None] = {}
        self._next_order = 0
        # the lists the last due() that named an engine returned, by id(): each names
        # an id once, so payloads() skips the repeat check for them. Plain lists:
        # str.join copies a list subclass before joining (a subclass made the 10-id
        # payload 1.6x slower)
        self._handed: dict[int, list[str]] = {}
        # the earliest ``now`` at which some engine can be due, derived from
        # the rule (see _threshold); -inf while some engine never had a
        # heartbeat (or is pending), +inf with no engine
        self._next_at = -math.inf
        self._last_now = FIRST_NOW
        self._tracked = 0
        self._c = {
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
        if not plain_id(remote, self._max_id):  # the common case at C speed, one call
            check_wire_id(remote, self._max_id)  # decides and words the error
        if type(req_id) is not str and not isinstance(req_id, str):
            raise LocalProtocolError(f"request id must be a str, got {type(req_id).__name__}")
        engine_of = self._engine_of
        if req_id in engine_of:
            raise LocalProtocolError(
                f"request {req_id!r} is already tracked (engine {engine_of[req_id][0].engine!r})"
            )
        try:  # finite, not back, not a bool (a bool is at most 1)
            ok = self._last_now <= now < _INF and (
                now > 1.0 or (type(now) is float and now > -_INF)
            )
        except TypeError:
            ok = False
        if not ok:
            self._clock(now)  # raises, or advances
        self._last_now = now
        try:
            reqs = self._by_engine[engine_id]
        except KeyError:
            reqs = self._new_engine(engine_id)
        n = reqs.get(remote)
        reqs[remote] = 1 if n is None else n + 1
        engine_of[req_id] = (reqs, remote)
        self._tracked += 1

    def _new_engine(self, engine_id: str) -> _Requests:
        reqs = _Requests(engine_id)
        self._by_engine[engine_id] = reqs
        self._order[engine_id] = self._next_order
        self._next_order += 1
        self._unsent[engine_id] = None
        self._next_at = -math.inf  # a new engine is due at once
        return reqs

    def untrack(self, req_id: str) -> None:
        """Stop heartbeating ``req_id`` (transfer done, finished, aborted, or
        no longer needs a transfer). Unknown ids are a no-op."""
        entry = self._engine_of.pop(req_id, None)
        if entry is None:
            return
        reqs, remote = entry
        n = reqs[remote]
        if n > 1:
            reqs[remote] = n - 1  # another tracked request names it: heartbeats go on
        else:
            del reqs[remote]
            if not reqs:
                self._forget(reqs.engine)

    def _forget(self, engine: str) -> None:
        del self._by_engine[engine]
        del self._order[engine]
        self._unsent.pop(engine, None)
        # the threshold stays a lower bound: forgetting an engine only raises it
        self._last_sent.pop(engine, None)

    def drop_engine(self, engine_id: str) -> list[str]:
        """Forget every request of ``engine_id`` (its P is gone: the caller fails
        them over to recompute or an error). Returns their local ids."""
        if engine_id not in self._by_engine:
            return []
        self._forget(engine_id)
        dropped = self.requests(engine_id)
        for rid in dropped:
            del self._engine_of[rid]
        self._c["dropped"] += len(dropped)
        return dropped

    def _threshold(self) -> float:
        """The smallest ``now`` at which the oldest engine is due, found by
        asking the rule itself at that float and the one below it; the rule
        is monotone in ``now`` and in ``last_sent`` (``tests/test_fastpaths``
        proves it over IEEE doubles), so below it no engine is due. -inf (no
        shortcut) when every engine had no heartbeat yet or the rule does not
        give a threshold within a few floats of ``last + interval``."""
        lasts = self._last_sent
        if self._unsent:
            return -math.inf
        if not lasts:
            return math.inf
        rule = R.heartbeat_due
        interval = self.config.heartbeat_interval
        oldest = next(iter(lasts.values()))
        t = oldest + interval
        if math.isnan(t):  # no threshold
            return -math.inf
        for _ in range(8):  # rounding puts the threshold within a float or two
            if rule(oldest, t, interval):
                below = math.nextafter(t, -math.inf)
                if not rule(oldest, below, interval):
                    return t
                t = below
            else:
                t = math.nextafter(t, math.inf)
        return -math.inf

    def due(self, *, now: float, pending: Collection[str] = ()) -> dict[str, list[str]]:
        """The heartbeats to send now: engine id -> P's ids of its tracked
        requests (each once, in tracking order: what :meth:`payloads` takes),
        for each engine that never had a heartbeat or whose last one
        is at least ``heartbeat_interval`` old. Returned engines are marked as
        sent at ``now``. Engines in ``pending`` (not connected yet) are left
        out and keep their turn.
        """
        try:  # not before the last now, below the oldest engine's threshold (so finite:
            # the threshold is finite or -inf once a now was seen), and not a bool (a
            # bool is at most 1: one comparison for a clock past 1 s)
            if self._last_now <= now < self._next_at and (now > 1.0 or type(now) is float):
                self._last_now = now
                return {}  # nothing is due
        except TypeError:
            pass  # not a number: the full check refuses it
        self._clock(now)
        rule = R.heartbeat_due
        interval = self.config.heartbeat_interval
        by_engine = self._by_engine
        lasts = self._last_sent
        # engines never sent to, then the sent ones oldest first until one is not due
        unsent = self._unsent
        due = list(unsent)
        for engine, last in lasts.items():
            if not rule(last, now, interval):
                break
            due.append(engine)
        if len(due) > 1:
            due.sort(key=self._order.__getitem__)
        out: dict[str, list[str]] = {}
        handed: dict[int, list[str]] = {}
        for engine in due:
            if engine in pending:
                self._c["deferred"] += 1
                continue
            ids = out[engine] = list(by_engine[engine])  # its remote ids, each once
            handed[id(ids)] = ids
            if engine in unsent:
                del unsent[engine]
            else:
                del lasts[engine]  # re-inserted at the end: the newest
            lasts[engine] = now
        if handed:
            self._handed = handed
        self._c["heartbeats"] += len(out)
        self._c["heartbeat_ids"] += sum(len(v) for v in out.values())
        self._next_at = self._threshold()
        return out

    def next_due(self) -> float | None:
        """When the next heartbeat falls due (``-inf`` if one is due now)."""
        if not self._by_engine:
            return None
        if self._unsent:
            return -math.inf
        # the oldest last heartbeat gives the minimum: rounding keeps x + c monotone in x
        return next(iter(self._last_sent.values())) + self.config.heartbeat_interval

    def payloads(self, ids: list[str], *, max_bytes: int | None = None) -> list[bytes]:
        """The heartbeat messages for ``ids``, one engine's list that :meth:`due`
        returned: ``wire.encode_heartbeat(ids, max_bytes=max_bytes)`` byte for
        byte (default ``config.max_notification_bytes``), without its per-id
        checks: :meth:`track` checked each id (``check_wire_id``), so what is
        left is one join and the cuts at the last ``,`` that fits, and dropping
        repeats from a list that the last :meth:`due` naming an engine did not
        return (its lists name each id once; it knows them by identity, so a repeat
        a caller adds to one is sent twice). ``tests/test_hot_paths.py``
        compares the two on random ids, and ``leaseproto prove`` (L16) on due()'s
        own lists and on copies of them.

        Raises:
            ValueError: as ``encode_heartbeat`` does (``max_bytes`` leaves no
                room, or an id does not fit in one message).
        """
        max_bytes = self.config.max_notification_bytes if max_bytes is None else max_bytes
        room = max_bytes - _HB_LEN
        # due()'s lists have no repeats (they are held in _handed, so no other object
        # can have their id)
        if id(ids) not in self._handed and len(set(ids)) != len(ids):
            ids = list(dict.fromkeys(ids))  # repeats are sent once, where first named
        if not ids or room < 1:
            return wire.encode_heartbeat(ids, max_bytes=max_bytes)  # [] or the error
        data = ",".join(ids).encode()
        if len(data) <= room:
            return [_HB + data]
        out: list[bytes] = []
        add, rfind, hb = out.append, data.rfind, _HB
        start, last, step = 0, len(data) - room, room + 1
        while start < last:
            cut = rfind(b",", start, start + step)  # just after the last id that fits
            if cut < 0:  # an id longer than a message: encode_heartbeat says which
                return wire.encode_heartbeat(ids, max_bytes=max_bytes)
            add(hb + data[start:cut])
            start = cut + 1
        add(hb + data[start:])
        return out

    # -- queries --------------------------------------------------------------------------
    def engines(self) -> list[str]:
        """Engines with tracked requests (the ones D must be connected to)."""
        return list(self._by_engine)

    def engine_of(self, req_id: str) -> str | None:
        entry = self._engine_of.get(req_id)
        return None if entry is None else entry[0].engine

    def remote_id(self, req_id: str) -> str | None:
        entry = self._engine_of.get(req_id)
        return None if entry is None else entry[1]

    def requests(self, engine_id: str) -> list[str]:
        """Local ids tracked for ``engine_id``, in tracking order (a pass over every
        tracked request: for queries, not for each step)."""
        return [rid for rid, (reqs, _) in self._engine_of.items() if reqs.engine == engine_id]

    @property
    def stats(self) -> TrackerStats:
        live = len(self._engine_of)
        untracked = self._tracked - live - self._c["dropped"]
        return TrackerStats(
            tracked=self._tracked,
            untracked=untracked,
            **self._c,
            live=live,
            engines=len(self._by_engine),
        )

    def __len__(self) -> int:
        return len(self._engine_of)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._engine_of
