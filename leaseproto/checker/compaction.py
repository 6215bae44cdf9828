"""A deadline queue the table compacts early, so that a small world reaches
:meth:`~leaseproto.core.deadlines.DeadlineQueue.compact` (scopes with
``compaction_slack``).

The table compacts its queue when the stale entries (of leases that ended other
than by expiry) exceed the live leases by 1024 (``LeaseTable._end``, spec §9.3):
no world of a few requests gets there. This queue shows the table a stale count
raised by ``1024 - slack``, so the table's own test, unchanged, compacts once
the stale entries exceed the live leases by ``slack``; the real ``compact``,
``take_due`` and ``next_deadline`` run on the real entries. :attr:`compactions`
counts the compactions, so a scope can show that it reached one.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.deadlines import DeadlineQueue
from ..core.lease import Lease

__all__ = ["TABLE_SLACK", "EagerQueue"]

#: the slack the table compacts at (``queue.stale > live + 1024``, ``LeaseTable._end``)
TABLE_SLACK = 1024


class EagerQueue(DeadlineQueue):
    """A :class:`DeadlineQueue` the table compacts at ``stale > live + slack``."""

    __slots__ = ("_bias", "_stale", "compactions")

    def __init__(self, slack: int) -> None:
        self._bias = TABLE_SLACK - slack
        self._stale = 0
        self.compactions = 0
        super().__init__()

    @property
    def stale(self) -> int:
        """The stale entries, raised by the bias (what the table compares)."""
        return self._stale + self._bias

    @stale.setter
    def stale(self, value: int) -> None:
        self._stale = max(0, value - self._bias)

    @property
    def stale_entries(self) -> int:
        """The stale entries counted, without the bias."""
        return self._stale

    def compact(self, live: dict[str, Lease]) -> None:
        self.compactions += 1
        super().compact(live)

    def copy(self, remap: Callable[[Lease], Lease]) -> EagerQueue:
        base = super().copy(remap)
        new = EagerQueue(TABLE_SLACK - self._bias)
        new._buckets, new._keys = base._buckets, base._keys
        new._stale, new.compactions = self._stale, self.compactions
        return new
