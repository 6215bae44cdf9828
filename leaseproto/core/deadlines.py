"""P's leases by deadline, for the reaper (``LeaseTable.expire``).

Two parts. Leases granted for the table's default ``kv_lease_duration`` go into a
list in grant order (*the grants*): their deadlines at grant,
``grant_deadline(granted_at, ttl)``, are in that order too (``now`` never decreases,
the rule is monotone in it, and :meth:`DeadlineQueue.grant` checks it: a grant
out of order would go into the calendar). So the grants that came due are a
prefix, found by bisection and taken whole, and a lease granted alone costs one
list slot, not a bucket.

Every other entry (a lease granted for another ``ttl``, or renewed past its grant
deadline) is in a calendar of exact deadlines: each bucket holds the leases queued
at one deadline, in grant order, and a heap holds the distinct deadlines. Leases
share deadlines: a heartbeat's renewals share one ``now + extension``. So a burst
of expiries pops one heap entry per distinct deadline, not one per lease.

Renewals only move ``lease.deadline`` (and set ``last_renewal``); the queue is
lazy. A lease is found where it was queued: a grant that comes due and was renewed
since goes into the calendar at its deadline, and a calendar entry that comes due
for a lease renewed past it is queued again at its deadline (so ``expire`` touches
only what came due, never the live set: upstream bug B1 came from a reaper that
assumed insertion order). An entry of a lease that ended otherwise (transferred,
aborted) is *stale*: dropped when met, and the table compacts the queue when there
are more stale entries than live leases.

Order: earliest deadline first, ties in grant order (``Lease.seq``), as the
naive model releases them; a bucket is kept sorted by ``seq``, and the due grants
and the due calendar entries are merged by ``(deadline, seq)``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator
from itertools import compress, repeat
from operator import and_, attrgetter, eq, gt, is_

from . import rules as R
from .lease import Lease

__all__ = ["DeadlineQueue"]

_SEQ: Callable[[Lease], int] = attrgetter("seq")
_DEADLINE: Callable[[Lease], float] = attrgetter("deadline")
_LAST: Callable[[Lease], float | None] = attrgetter("last_renewal")
_STATE: Callable[[Lease], int] = attrgetter("state")
#: release order: earliest deadline first, ties in grant order
_ORDER: Callable[[Lease], tuple[float, int]] = attrgetter("deadline", "seq")
#: a bucket at least this long is first checked whole (below it the loop is cheaper)
_WHOLE = 8


def _clean(bucket: list[Lease], d: float) -> bool:
    """Every entry of ``bucket`` (queued at ``d``) is a live lease still due at ``d``:
    none ended (``Lease.state``: no stale entry), none renewed since (``take_due`` then
    takes the bucket whole)."""
    return all(map(eq, map(_DEADLINE, bucket), repeat(d))) and all(
        map(eq, map(_STATE, bucket), repeat(R.GRANTED))
    )


class DeadlineQueue:
    """Leases by the deadline they were queued at.

    ``ttl``: the table's default lease duration, whose grants go into the list of
    grants (:meth:`grant`); ``None``: every entry goes into the calendar.
    """

    __slots__ = ("_buckets", "_first", "_grants", "_head", "_keys", "_tail", "_ttl", "stale")

    def __init__(self, ttl: float | None = None) -> None:
        self._buckets: dict[float, list[Lease]] = {}
        self._keys: list[float] = []  # heap of the buckets' deadlines
        self._ttl = ttl
        #: leases granted for ``ttl``, in grant order; ``_grants[:_head]`` are taken
        self._grants: list[Lease] = []
        self._head = 0
        self._tail = -math.inf  # the deadline of the latest grant in the list
        # no grant in the list is due before this (a lower bound of the first one's)
        self._first = math.inf
        #: entries of leases that ended other than by expiry (set by the table)
        self.stale = 0

    def grant(self, lease: Lease, *, default_ttl: bool) -> None:
        """Queue a lease just granted at its deadline: in the list of grants when
        ``default_ttl`` (it was granted for this queue's ``ttl``, so its deadline is
        ``grant_deadline(granted_at, ttl)``) and that is not before the latest grant's
        (``now`` never decreases, and the rule is monotone in it: so always), else in
        the calendar."""
        deadline = lease.deadline
        if default_ttl and self._ttl is not None and self._tail <= deadline:
            self._grants.append(lease)
            self._tail = deadline
            self._first = min(self._first, deadline)  # lowered when the list was empty
        else:
            self.push(lease)

    def _granted_until(self, lease: Lease) -> float:
        """The deadline a lease of the grants was queued at: the one it was granted."""
        return R.grant_deadline(lease.granted_at, self._ttl)  # type: ignore[arg-type]

    def push(self, lease: Lease) -> None:
        """Queue a lease just granted (the largest ``seq`` yet) at its deadline."""
        d = lease.deadline
        bucket = self._buckets.get(d)
        if bucket is None:
            self._buckets[d] = [lease]
            heapq.heappush(self._keys, d)
        else:
            bucket.append(lease)

    def requeue(self, lease: Lease) -> None:
        """Queue a lease again at its (renewed) deadline, in ``seq`` order."""
        bucket = self._buckets.get(lease.deadline)
        if bucket is not None and bucket[-1].seq > lease.seq:
            bisect.insort(bucket, lease, key=_SEQ)
        else:
            self.push(lease)

    def _requeue_all(self, leases: list[Lease]) -> bool:
        """Queue ``leases`` again, when they are live and were all renewed to one
        deadline (a heartbeat renews an engine's requests together): what
        :meth:`requeue` does to each, for the whole list (in ``seq`` order) at C speed.
        False (nothing done) otherwise."""
        later = leases[0].deadline
        if not (
            all(map(eq, map(_STATE, leases), repeat(R.GRANTED)))
            and all(map(eq, map(_DEADLINE, leases), repeat(later)))
        ):
            return False
        self._queue_group(later, leases)
        return True

    def _queue_group(self, later: float, leases: list[Lease]) -> None:
        """Queue ``leases`` (live, in ``seq`` order, each with deadline ``later``) at
        ``later``, merged into its bucket in ``seq`` order."""
        bucket = self._buckets.get(later)
        if bucket is None:
            self._buckets[later] = leases
            heapq.heappush(self._keys, later)
        elif bucket[-1].seq < leases[0].seq:
            bucket += leases
        else:
            bucket[:] = sorted(bucket + leases, key=_SEQ)

    def _dropped(self) -> None:
        self.stale = max(0, self.stale - 1)

    def _take_grants(self, now: float, live: dict[str, Lease]) -> list[Lease]:
        """The grants queued at ``<= now``, taken out of the list: those never renewed
        (due at the deadline they were granted), in grant order; the renewed ones go
        into the calendar at their deadlines (``take_due`` then takes those that are
        due too); stale entries are dropped."""
        grants, head = self._grants, self._head
        cut = bisect.bisect_right(grants, now, head, key=self._granted_until)
        if cut * 2 >= len(grants) and cut >= 1024:  # the list keeps what is not taken
            run = grants[head:cut]
            del grants[:cut]
            cut = 0
        else:
            run = grants[head:cut]
        self._head = cut
        self._first = self._granted_until(grants[cut]) if cut < len(grants) else math.inf
        if not run:
            return run
        # each entry at C speed: still held (its lease not ended: ``Lease.state``), and
        # never renewed (so due at the deadline it was granted)
        held = list(map(eq, map(_STATE, run), repeat(R.GRANTED)))
        fresh = list(map(is_, map(_LAST, run), repeat(None)))
        if all(held) and all(fresh):
            return run
        self.stale = max(0, self.stale - held.count(False))  # stale entries dropped
        out = list(compress(run, map(and_, held, fresh)))
        renewed = list(compress(run, map(gt, held, fresh)))  # held and not fresh
        if len(renewed) > 1 and self._requeue_all(renewed):  # renewed alike since
            return out
        by_deadline: dict[float, list[Lease]] = {}  # into the calendar at their deadlines
        for lease in renewed:
            group = by_deadline.get(lease.deadline)
            if group is None:
                by_deadline[lease.deadline] = [lease]
            else:
                group.append(lease)
        for later, group in by_deadline.items():
            self._queue_group(later, group)
        return out

    def take_due(self, now: float, live: dict[str, Lease]) -> list[Lease]:
        """The live leases whose deadline is ``<= now``, earliest first, ties in
        grant order, taken out of the queue. A renewed lease met on the way is
        queued again at its deadline (and taken too when that is due); stale
        entries are dropped."""
        granted = self._take_grants(now, live) if self._first <= now else []
        keys, buckets = self._keys, self._buckets
        out: list[Lease] = []
        add = out.append
        while keys and keys[0] <= now:
            d = heapq.heappop(keys)
            popped = buckets.pop(d)
            if len(popped) >= _WHOLE and _clean(popped, d):
                out += popped  # what the loop below does with a clean bucket, at C speed
                continue
            if len(popped) > 1 and popped[0].deadline != d and self._requeue_all(popped):
                continue  # renewed alike since: what the loop below does, at C speed
            for lease in popped:
                if live.get(lease.req_id) is not lease:
                    self._dropped()
                    continue
                later = lease.deadline
                if later == d:
                    add(lease)
                    continue
                # renewed since: queued again at its deadline (requeue, inline: a
                # lease renewed once per heartbeat interval comes here every ~15 s)
                bucket = buckets.get(later)
                if bucket is None:
                    buckets[later] = [lease]
                    heapq.heappush(keys, later)
                elif bucket[-1].seq < lease.seq:
                    bucket.append(lease)
                else:
                    bisect.insort(bucket, lease, key=_SEQ)
        if not granted:
            return out
        return sorted(out + granted, key=_ORDER) if out else granted

    def next_deadline(self, live: dict[str, Lease]) -> float | None:
        """The earliest deadline of a live lease (stale entries met are dropped,
        renewed ones queued again)."""
        first = self._first_grant(live)
        keys, buckets = self._keys, self._buckets
        while keys:
            d = keys[0]
            bucket = buckets[d]
            for i, lease in enumerate(bucket):
                if live.get(lease.req_id) is not lease:
                    self._dropped()
                elif lease.deadline != d:
                    self.requeue(lease)
                else:
                    del bucket[:i]
                    break
            else:
                del buckets[d]
                if keys[0] == d:
                    heapq.heappop(keys)
                else:  # a rule that moved a deadline back queued it below d
                    keys.remove(d)
                    heapq.heapify(keys)
                continue
            if keys[0] == d:
                return first if first is not None and first < d else d
        return first

    def _first_grant(self, live: dict[str, Lease]) -> float | None:
        """The deadline of the first live grant never renewed (the earliest of the
        grants: their deadlines are in grant order); the grants before it are stale
        (dropped) or renewed (moved into the calendar at their deadline)."""
        grants = self._grants
        while self._head < len(grants):
            lease = grants[self._head]
            if live.get(lease.req_id) is not lease:
                self._dropped()
            elif lease.last_renewal is None:
                return lease.deadline
            else:
                self.requeue(lease)
            self._head += 1
        return None

    def compact(self, live: dict[str, Lease]) -> None:
        """Drop every stale entry."""
        self._grants = [x for x in self._grants[self._head :] if live.get(x.req_id) is x]
        self._head = 0
        for d, bucket in list(self._buckets.items()):
            kept = [lease for lease in bucket if live.get(lease.req_id) is lease]
            if kept:
                self._buckets[d] = kept
            else:
                del self._buckets[d]
        self._keys = list(self._buckets)
        heapq.heapify(self._keys)
        self.stale = 0

    def entries(self) -> Iterator[tuple[float, Lease]]:
        """``(deadline queued at, lease)`` for every entry: the calendar's in release
        order, then the grants' in grant order."""
        for d in sorted(self._buckets):
            for lease in self._buckets[d]:
                yield d, lease
        for lease in self._grants[self._head :]:
            yield self._granted_until(lease), lease

    def copy(self, remap: Callable[[Lease], Lease]) -> DeadlineQueue:
        """A copy whose entries are ``remap(lease)`` (the model checker's clones)."""
        new = DeadlineQueue(self._ttl)
        new._buckets = {d: [remap(x) for x in b] for d, b in self._buckets.items()}
        new._keys = list(self._keys)
        new._grants = [remap(x) for x in self._grants[self._head :]]
        new._tail, new._first = self._tail, self._first
        new.stale = self.stale
        return new

    def __len__(self) -> int:
        return sum(map(len, self._buckets.values())) + len(self._grants) - self._head
