"""One lease's record on P and the counters of a table (spec §6.1)."""

from __future__ import annotations

from dataclasses import dataclass

from . import rules as R

__all__ = ["Lease", "TableStats"]


@dataclass(frozen=True, slots=True)
class TableStats:
    """Counters of a :class:`LeaseTable` since it was made."""

    granted: int = 0
    renewed: int = 0
    #: heartbeat ids naming no lease P knows (never granted, or forgotten)
    renew_unknown: int = 0
    #: heartbeat ids naming a lease that had already ended (late heartbeats)
    renew_late: int = 0
    #: heartbeat ids naming a granted lease whose deadline had passed (not yet reaped)
    renew_lapsed: int = 0
    released_transferred: int = 0
    released_expired: int = 0
    released_aborted: int = 0
    #: transfer-done after expiry or abort (reported as :class:`LateTransfer`)
    late_transfers: int = 0
    #: transfer-done after the lease was completed by earlier ones (also
    #: reported as :class:`LateTransfer`: a surplus or replayed notification)
    excess_transfers: int = 0
    #: aborts naming an ended lease
    late_aborts: int = 0
    #: transfer-done or abort for an id not yet granted, staged
    early_staged: int = 0
    #: staged notifications applied by a later grant
    early_applied: int = 0
    #: staged notifications dropped (too old, or staging full)
    early_dropped: int = 0
    #: live leases now
    live: int = 0


class Lease:
    """A live lease on P (the table's record of it).

    ``state`` is the rules' state: GRANTED while the lease is in the table. A lease
    that ends leaves the table, and its end is kept in the table's tombstone; a
    lease that ends by a transfer or an abort also gets that state here, so that a
    queue entry still pointing at the record reads as stale (``state != GRANTED``,
    the same as ``live.get(req_id) is not lease``: ``tests/test_table.py``); an
    expired lease's entry is the one the reaper took. Nothing else writes an ended
    lease's record.

    Seven slots, the fewest that hold what a lease needs (a record is 88 bytes, the
    largest part of a live lease's memory, docs/performance.md): the counts of a
    lease that reads from more than one D worker are in ``counts``, ``None`` for
    the usual one (``consumers = readers = 1``, nothing done yet); the cap is
    ``granted_at + max_lease_lifetime``, computed where it is needed, as
    :meth:`~leaseproto.core.table.LeaseTable.grant` computes it.
    """

    __slots__ = ("counts", "deadline", "granted_at", "last_renewal", "req_id", "seq", "state")

    def __init__(
        self, req_id: str, now: float, deadline: float, consumers: int = 1, *, seq: int
    ) -> None:
        self.req_id = req_id
        self.state = R.GRANTED
        self.granted_at = now
        self.deadline = deadline
        #: ``(consumers, readers, done)``, or ``None`` for ``(1, 1, 0)``; ``readers``
        #: is how many transfer-dones complete it (the latest notification's n)
        self.counts: tuple[int, int, int] | None = (
            None if consumers == 1 else (consumers, consumers, 0)
        )
        self.last_renewal: float | None = None
        #: grant order (the table's count of grants): ties in expiry go by it
        self.seq = seq

    @property
    def consumers(self) -> int:
        return 1 if self.counts is None else self.counts[0]

    @property
    def readers(self) -> int:
        return 1 if self.counts is None else self.counts[1]

    @property
    def done(self) -> int:
        return 0 if self.counts is None else self.counts[2]
