"""P's leases by deadline, for the reaper (``LeaseTable.expire``).

A calendar of exact deadlines: each bucket holds the leases queued at one
deadline, in grant order, and a heap holds the distinct deadlines. Leases
share deadlines: a step's grants share its ``now``, and a heartbeat's renewals
share one ``now + extension``. So a burst of expiries pops one heap entry per
distinct deadline, not one per lease, and a lease costs one list slot here.

Renewals only move ``lease.deadline``; the queue is lazy. A lease is found in
the bucket of the deadline it had when it was queued: when that bucket comes
due and the lease was renewed past it, it is queued again at its deadline
(so ``expire`` touches only what came due, never the live set: upstream bug
B1 came from a reaper that assumed insertion order). An entry of a lease that
ended otherwise (transferred, aborted) is *stale*: dropped when met, and the
table compacts the queue when there are more stale entries than live leases.

Order: earliest deadline first, ties in grant order (``Lease.seq``), as the
naive model releases them; a bucket is kept sorted by ``seq``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from itertools import repeat
from operator import attrgetter, eq, is_

from .lease import Lease

__all__ = ["DeadlineQueue"]

_SEQ: Callable[[Lease], int] = attrgetter("seq")
_REQ_ID: Callable[[Lease], str] = attrgetter("req_id")
_DEADLINE: Callable[[Lease], float] = attrgetter("deadline")
#: a bucket at least this long is first checked whole (below it the loop is cheaper)
_WHOLE = 8


def _clean(bucket: list[Lease], d: float, live: dict[str, Lease]) -> bool:
    """Every entry of ``bucket`` (queued at ``d``) is a live lease still due at ``d``:
    no stale entry, none renewed since (``take_due`` then takes the bucket whole)."""
    return all(map(is_, map(live.get, map(_REQ_ID, bucket)), bucket)) and all(
        map(eq, map(_DEADLINE, bucket), repeat(d))
    )


class DeadlineQueue:
    """Leases by the deadline they were queued at."""

    __slots__ = ("_buckets", "_keys", "stale")

    def __init__(self) -> None:
        self._buckets: dict[float, list[Lease]] = {}
        self._keys: list[float] = []  # heap of the buckets' deadlines
        #: entries of leases that ended other than by expiry (set by the table)
        self.stale = 0

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

    def _dropped(self) -> None:
        self.stale = max(0, self.stale - 1)

    def take_due(self, now: float, live: dict[str, Lease]) -> list[Lease]:
        """The live leases whose deadline is ``<= now``, earliest first, ties in
        grant order, taken out of the queue. A renewed lease met on the way is
        queued again at its deadline (and taken too when that is due); stale
        entries are dropped."""
        keys, buckets = self._keys, self._buckets
        out: list[Lease] = []
        add = out.append
        while keys and keys[0] <= now:
            d = heapq.heappop(keys)
            popped = buckets.pop(d)
            if len(popped) >= _WHOLE and _clean(popped, d, live):
                out += popped  # what the loop below does with a clean bucket, at C speed
                continue
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
        return out

    def next_deadline(self, live: dict[str, Lease]) -> float | None:
        """The earliest deadline of a live lease (stale entries met are dropped,
        renewed ones queued again)."""
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
                return d
        return None

    def compact(self, live: dict[str, Lease]) -> None:
        """Drop every stale entry."""
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
        """``(deadline queued at, lease)`` for every entry, in release order."""
        for d in sorted(self._buckets):
            for lease in self._buckets[d]:
                yield d, lease

    def copy(self, remap: Callable[[Lease], Lease]) -> DeadlineQueue:
        """A copy whose entries are ``remap(lease)`` (the model checker's clones)."""
        new = DeadlineQueue()
        new._buckets = {d: [remap(x) for x in b] for d, b in self._buckets.items()}
        new._keys = list(self._keys)
        new.stale = self.stale
        return new

    def __len__(self) -> int:
        return sum(map(len, self._buckets.values()))
