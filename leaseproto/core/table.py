"""The prefill side: one lease per request (spec §6, §8.1-8.5).

Expiry uses :class:`.deadlines.DeadlineQueue`: the leases granted for the default
``kv_lease_duration`` in grant order (which is their deadlines' order), every other
one in a calendar of exact deadlines (a bucket of leases per deadline, a heap of the
distinct deadlines). Renewals only move ``lease.deadline`` (O(1) per id); when the
reaper meets a lease that was renewed past the deadline it was queued at, it queues
it again at the new one. So ``expire`` touches only what came due, never the live
set (upstream bug B1 came from a reaper that assumed insertion order).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import fields
from itertools import repeat
from operator import attrgetter

from . import rules as R
from .checks import FIRST_NOW, advance, check_count, check_finite, check_positive, check_wire_id
from .config import LeaseConfig
from .deadlines import DeadlineQueue
from .errors import LocalProtocolError
from .events import LateTransfer, Release, ReleaseReason, Releases, TransferCounted
from .lease import Lease, TableStats
from .renewal import Renewals
from .wire import MAX_COUNT

__all__ = ["LeaseTable", "TableStats"]


_REQ_ID = attrgetter("req_id")
_INF = math.inf
_NINF = -math.inf
_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend

_REASON = {
    R.TRANSFERRED: ReleaseReason.TRANSFERRED,
    R.EXPIRED: ReleaseReason.EXPIRED,
    R.ABORTED: ReleaseReason.ABORTED,
}
_NONE = Releases((), [], ReleaseReason.EXPIRED, 0.0)  # what a call that releases nothing returns


# -- the reaper's rule, as ordinary code (spec §8.5) -------------------------------------------
def expire_end(state: int, deadline: float, now: float) -> int | None:
    """:func:`.rules.expire_state` for a lease :func:`.rules.expire_due` finds due,
    ``None`` for one it does not: what ``expire`` asks of the leases the queue hands it
    (``leaseproto prove``, lemma L14, runs this on z3 terms and shows it equal to the
    two rules, and that what it expires at a deadline it expires at every earlier one,
    so ``expire`` asks it once per state, at the latest deadline of a burst)."""
    if state == R.GRANTED and deadline <= now:
        return R.EXPIRED
    return None


class LeaseTable(Renewals):
    """P's leases. Owns no clock: every time-dependent call takes ``now``.

    ``now`` must never decrease between calls (:class:`LocalProtocolError`).
    """

    def __init__(self, config: LeaseConfig | None = None) -> None:
        self.config = config if config is not None else LeaseConfig()
        self._max_id = self.config.max_id_bytes
        self._extension = self.config.lease_extension
        self._cap = self.config.max_lease_lifetime
        self._leases: dict[str, Lease] = {}
        # the leases by deadline, for expire (those granted for the default ttl in a list)
        self._queue = DeadlineQueue(float(self.config.kv_lease_duration))
        self._seq = itertools.count()  # grant order: ties in expire go by it
        # ended leases, oldest first: id -> (state, ended_at)
        self._ended: OrderedDict[str, tuple[int, float]] = OrderedDict()
        # notifications for ids not yet granted:
        # id -> [first_seen, transfers, aborted, readers of the latest (0: none given)]
        self._staged: OrderedDict[str, list[float]] = OrderedDict()
        self._last_now = FIRST_NOW
        self._c = dict.fromkeys((f.name for f in fields(TableStats)), 0)
        self._tomb: tuple[int, float] = (R.ABSENT, -math.inf)
        # no tombstone or staged notification is too old before this (a lower bound)
        self._prune_at = _INF
        # the now and deadline of the latest grant for the default ttl
        self._step: tuple[float | None, float] = (None, math.inf)

    # -- helpers --------------------------------------------------------------------------
    def _clock(self, now: float) -> None:
        self._last_now = advance(self._last_now, now)

    def _end(self, lease: Lease, state: int, now: float) -> Release:
        del self._leases[lease.req_id]
        lease.state = state  # its queue entry is stale now
        tomb = self._tomb
        if tomb[0] != state or tomb[1] is not now:
            tomb = self._tomb = (state, now)  # shared by the leases one call ends
        self._ended[lease.req_id] = tomb  # new (a live id has none): the newest, last
        self._kept(now + self.config.tombstone_ttl)
        while len(self._ended) > self.config.tombstone_capacity:
            self._ended.popitem(last=False)
        reason = _REASON[state]
        self._c["released_" + reason.value] += 1
        if state != R.EXPIRED:  # the reaper pops expired entries itself
            queue = self._queue
            queue.stale += 1
            if queue.stale > len(self._leases) + 1024:
                queue.compact(self._leases)
        return Release(
            lease.req_id,
            reason,
            now,
            granted_at=lease.granted_at,
            deadline=lease.deadline,
            last_renewal=lease.last_renewal,
        )

    def _prune(self, now: float) -> None:
        ttl = self.config.tombstone_ttl
        ended = self._ended
        while ended:
            _, (_, at) = next(iter(ended.items()))
            if at + ttl > now:
                break
            ended.popitem(last=False)
        sttl = self.config.staging_ttl
        staged = self._staged
        while staged:
            _, entry = next(iter(staged.items()))
            if entry[0] + sttl > now:
                break
            staged.popitem(last=False)
            self._c["early_dropped"] += 1
        # when the oldest tombstone or staged notification is next too old
        first = _INF if not ended else next(iter(ended.values()))[1] + ttl
        if staged:
            at = next(iter(staged.values()))[0] + sttl
            first = at if at < first else first
        self._prune_at = first

    def _kept(self, until: float) -> None:
        """An entry was added that :meth:`_prune` forgets at ``until``."""
        self._prune_at = min(self._prune_at, until)

    def _stage(self, req_id: str, now: float, *, abort: bool, readers: int | None = None) -> None:
        entry = self._staged.get(req_id)
        if entry is None:
            if self.config.staging_capacity == 0:
                self._c["early_dropped"] += 1
                return
            if len(self._staged) >= self.config.staging_capacity:
                self._staged.popitem(last=False)
                self._c["early_dropped"] += 1
            entry = self._staged[req_id] = [now, 0.0, 0.0, 0.0]
            self._kept(now + self.config.staging_ttl)
        if abort:
            entry[2] = 1.0
        else:
            entry[1] += 1
            if readers is not None:
                entry[3] = float(readers)
        self._c["early_staged"] += 1

    # -- inputs ---------------------------------------------------------------------------
    def grant(
        self, req_id: str, *, now: float, consumers: int = 1, ttl: float | None = None
    ) -> Release | None:
        """Grant a lease until ``now + (ttl or kv_lease_duration)``.

        ``consumers`` is how many transfer-done notifications complete it when
        they carry no count; a notification's ``n`` (``readers``) overrides it,
        because D's tensor-parallel size is known only once D is picked, after
        the grant. Notifications staged before the grant are applied now, each
        with the ``n`` it carried; the returned
        :class:`Release` says they already complete it (free the blocks at once).

        Raises:
            LocalProtocolError: the id holds a live lease or cannot go on the
                wire (:func:`leaseproto.wire.check_id`, or longer than
                ``config.max_id_bytes``: rule C7); ``consumers`` is not an
                integer in ``[1, MAX_COUNT]``; ``ttl`` is not a positive finite
                number; ``now`` is not finite or went back; or the deadline or
                cap would not be finite. Nothing changes.
        """
        check_wire_id(req_id, self._max_id)
        if req_id in self._leases:
            raise LocalProtocolError(f"lease for {req_id!r} is live: it cannot be granted again")
        check_count("consumers", consumers, MAX_COUNT)
        ttl = self.config.kv_lease_duration if ttl is None else check_positive("ttl", ttl)
        default = ttl == self.config.kv_lease_duration  # queued in the list of grants
        cap = self.config.max_lease_lifetime
        advance(self._last_now, now)  # checked before anything changes
        if default and now is self._step[0]:
            deadline = self._step[1]  # a step's grants share its now: one deadline object
        else:
            deadline = R.grant_deadline(now, float(ttl))
        cap_at = None if cap is None else now + cap
        # (not ``math.isfinite``: a comparison, so ``leaseproto prove`` runs it on z3 terms;
        # ``now`` is finite and ``ttl``, ``cap`` positive, so only +inf can come out)
        if not deadline < _INF or (cap_at is not None and not cap_at < _INF):
            raise LocalProtocolError(f"now={now!r} + ttl={ttl!r} is not a finite deadline")
        self._clock(now)
        if default:
            self._step = (now, deadline)
        self._ended.pop(req_id, None)  # a reused id starts a new lease (spec §6.1)
        lease = Lease(req_id, now, deadline, consumers, seq=next(self._seq))
        self._leases[req_id] = lease
        self._queue.grant(lease, default_ttl=default)
        self._c["granted"] += 1
        staged = self._staged.pop(req_id, None)
        if staged is None:
            return None
        self._c["early_applied"] += 1
        if staged[2]:
            return self._end(lease, R.abort_state(lease.state), now)
        readers = int(staged[3]) or lease.consumers
        done = lease.done
        for _ in range(int(staged[1])):
            state = R.transfer_done_state(lease.state, done, readers)
            done = R.transfer_done_count(lease.state, done)
            if state != R.GRANTED:
                return self._end(lease, state, now)
        lease.counts = (consumers, readers, done)
        return None

    def transfer_done(
        self, req_id: str, *, now: float, readers: int | None = None
    ) -> Release | TransferCounted | LateTransfer | None:
        """Count one transfer-done notification for ``req_id``.

        ``readers`` is the notification's ``n`` (vLLM's count: how many D
        workers will notify this P worker); it decides how many transfer-dones
        complete the lease. Without it the granted ``consumers`` does.

        Returns :class:`Release` (``TRANSFERRED``) when it completes the lease;
        :class:`TransferCounted` when the lease is live and waits for more
        readers; :class:`LateTransfer` when the lease had already ended by
        expiry, abort, *or* earlier transfer-dones (the reader may have read
        reused blocks: answer it NK); ``None`` when P knows no lease by that id
        (never granted, or forgotten): the notification is staged for a later
        :meth:`grant`. :func:`leaseproto.wire.verdict` turns any of these into
        the verdict for the reader (I13).

        Raises:
            LocalProtocolError: ``readers`` is not an integer in
                ``[1, MAX_COUNT]``, or ``now`` went back. Nothing changes.
        """
        if readers is not None:
            check_count("readers", readers, MAX_COUNT)
        self._clock(now)
        lease = self._leases.get(req_id)
        if lease is not None:
            n = lease.consumers if readers is None else readers
            state = R.transfer_done_state(lease.state, lease.done, n)
            done = R.transfer_done_count(lease.state, lease.done)
            if state != R.GRANTED:
                return self._end(lease, state, now)
            lease.counts = (lease.consumers, n, done)
            return TransferCounted(req_id, now, done=done, readers=n)
        ended = self._ended.get(req_id)
        if ended is None:
            self._stage(req_id, now, abort=False, readers=readers)
            return None
        state, ended_at = ended
        self._c["excess_transfers" if state == R.TRANSFERRED else "late_transfers"] += 1
        return LateTransfer(req_id, _REASON[state], now, ended_at=ended_at)

    def abort(self, req_id: str, *, now: float) -> Release | None:
        """D aborted the request: release at once (``ABORTED``).

        Returns the :class:`Release`, or ``None`` when nothing was held (an
        ended lease is counted as late; an id not yet granted is staged, so a
        grant that follows releases at once).
        """
        self._clock(now)
        lease = self._leases.get(req_id)
        if lease is not None:
            return self._end(lease, R.abort_state(lease.state), now)
        if req_id in self._ended:
            self._c["late_aborts"] += 1
        else:
            self._stage(req_id, now, abort=True)
        return None

    def expire(self, *, now: float) -> Releases:
        """Release every lease with ``deadline <= now`` (``EXPIRED``), earliest
        deadline first (ties in grant order). Cost follows the leases (and the
        distinct deadlines) that came due, not the number of live leases. Also
        forgets tombstones and staged notifications older than their TTLs.

        Returns the :class:`Release` of each, as a :class:`Releases` sequence: its
        ``ids`` cost nothing more, and each ``Release`` is built when first read."""
        if type(now) is float and _NINF < self._last_now <= now < _INF:  # advance(), inline
            self._last_now = now
        else:
            self._clock(now)  # the first call, a now that is not a float, or raises
        # every live lease with deadline <= now, in deadline order (ties in grant order),
        # taken from the queue in one pass over the deadlines that came due
        due = self._queue.take_due(now, self._leases)
        out = _NONE
        if due:
            # every lease in the table is granted (``tests/test_hot_paths.py``): the rule
            # once, at their latest deadline, the last one's (take_due gives them earliest
            # first): what expire_end expires at a deadline it expires at every earlier
            # one (L14)
            if expire_end(R.GRANTED, due[-1].deadline, now) == R.EXPIRED:  # each expires
                out = self._expire_all(due, now)
            else:  # some is not due by the rule after all: lease by lease
                expired = []
                for lease in due:
                    if expire_end(lease.state, lease.deadline, now) is None:
                        self._queue.requeue(lease)  # back in the queue
                    else:
                        expired.append(lease)
                if expired:
                    out = self._expire_all(expired, now)
            if out is not _NONE:
                self._c["released_expired"] += len(out.ids)
                ended, capacity = self._ended, self.config.tombstone_capacity
                while len(ended) > capacity:
                    ended.popitem(last=False)
        if self._prune_at <= now:
            self._prune(now)
        return out

    def _expire_all(self, due: list[Lease], now: float) -> Releases:
        """End ``due`` (live leases, in release order) as ``EXPIRED`` at ``now``, at
        C speed: out of the live map, one tombstone value shared (trimmed by the
        caller); their releases, each built when read."""
        rids = list(map(_REQ_ID, due))
        _consume(map(self._leases.__delitem__, rids))
        # a live id has no tombstone (grant drops it), so each one is new: appended, newest last
        self._ended.update(zip(rids, repeat((R.EXPIRED, now))))
        self._kept(now + self.config.tombstone_ttl)
        return Releases(due, rids, _REASON[R.EXPIRED], now)

    # -- queries --------------------------------------------------------------------------
    def deadline(self, req_id: str) -> float | None:
        """The live lease's deadline, or ``None``."""
        lease = self._leases.get(req_id)
        return None if lease is None else lease.deadline

    def next_deadline(self) -> float | None:
        """The earliest deadline of any live lease (when to call :meth:`expire`)."""
        return self._queue.next_deadline(self._leases)

    def live(self) -> list[str]:
        """Ids of live leases, in grant order."""
        return list(self._leases)

    def lease_info(self, req_id: str) -> dict[str, float | int | None] | None:
        """A live lease's fields (for logs and debugging), or ``None``."""
        lease = self._leases.get(req_id)
        if lease is None:
            return None
        cap = self.config.max_lease_lifetime
        return {
            "granted_at": lease.granted_at,
            "deadline": lease.deadline,
            "cap_at": None if cap is None else lease.granted_at + cap,
            "consumers": lease.consumers,
            "readers": lease.readers,
            "done": lease.done,
            "last_renewal": lease.last_renewal,
        }

    def ended(self, req_id: str) -> ReleaseReason | None:
        """How a remembered ended lease ended, or ``None``."""
        entry = self._ended.get(req_id)
        return None if entry is None else _REASON[entry[0]]

    def lost_reason(self, req_id: str, *, now: float) -> ReleaseReason | None:
        """Why P no longer holds ``req_id``'s lease at ``now``, for the advisory
        lease-lost answer to a heartbeat (:func:`leaseproto.wire.lease_lost`):
        how it ended; ``EXPIRED`` for a live entry whose deadline has passed
        (the reaper will free it); ``None`` when P holds it, or knows nothing
        of it. A query: it does not advance the table's clock.

        Raises:
            LocalProtocolError: ``now`` is not a finite number.
        """
        check_finite("now", now)
        lease = self._leases.get(req_id)
        if lease is not None:
            return ReleaseReason.EXPIRED if lease.deadline <= now else None
        return self.ended(req_id)

    @property
    def stats(self) -> TableStats:
        return TableStats(**{**self._c, "live": len(self._leases)})

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._leases

    def __repr__(self) -> str:
        return f"<LeaseTable live={len(self._leases)} next_deadline={self.next_deadline()}>"
