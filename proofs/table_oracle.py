"""L15's oracle: the spec's naive model of P's table
(:class:`~leaseproto.checker.naive.NaiveLeaseTable`) with what the spec says beyond
it: which calls are local misuse (spec §10; they raise ``LocalProtocolError`` and
change nothing), how many readers complete a live lease, the heartbeat path that
takes a payload, and the advisory lost reason.

Written from the spec and the table's documented API, not from ``core/table.py``'s
checks: an id must go on the wire (§3.3, rule C7), a count is an integer in
``[1, 2^20]``, a ttl a positive finite number, ``now`` a finite number not before
the last ``now`` an input took (a query, ``lost_reason``, takes none), and a grant
whose deadline or cap would not be finite is refused.
"""

from __future__ import annotations

import math
from typing import Any

from leaseproto.checker import naive_wire
from leaseproto.checker.naive import NaiveLeaseTable
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.events import LateTransfer, Release, ReleaseReason, TransferCounted

from .loops import Sym

__all__ = ["OracleTable"]


def _number(x: object) -> bool:
    return isinstance(x, Sym) or (isinstance(x, (int, float)) and not isinstance(x, bool))


def _finite(x: Any) -> bool:
    """A finite number; a symbolic time is a finite real."""
    return _number(x) and (isinstance(x, Sym) or math.isfinite(x))


def _count(x: object) -> bool:
    return type(x) is int and 1 <= x <= naive_wire.COUNT_MAX


class OracleTable(NaiveLeaseTable):
    """The naive model, refusing misuse as spec §10 says, with the readers of each
    live lease (the latest transfer-done's ``n``, else the granted consumers)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.now: Any = None
        self.readers: dict[str, int] = {}

    def _time(self, now: Any) -> None:
        if not _finite(now) or (self.now is not None and now < self.now):
            raise LocalProtocolError(f"now={now!r} is not a time after {self.now!r}")

    def _advance(self, now: Any) -> None:
        self._time(now)
        self.now = now

    def grant(
        self, req_id: str, *, now: float, consumers: int = 1, ttl: float | None = None
    ) -> Release | None:
        longest = naive_wire.longest_id(self.config.max_notification_bytes)
        if not naive_wire.id_ok(req_id) or len(req_id.encode()) > longest:
            raise LocalProtocolError(f"id {req_id!r} cannot go on the wire")
        if req_id in self.leases or not _count(consumers):
            raise LocalProtocolError("a live id, or a bad count of consumers")
        if ttl is not None and not (_finite(ttl) and ttl > 0):
            raise LocalProtocolError(f"ttl={ttl!r}")
        self._time(now)
        cap = self.config.max_lease_lifetime
        ends = [now + (self.config.kv_lease_duration if ttl is None else ttl)]
        ends += [] if cap is None else [now + cap]
        if not all(_finite(x) for x in ends):
            raise LocalProtocolError("the deadline or the cap would not be finite")
        staged = self.staged.get(req_id)
        out = super().grant(req_id, now=now, consumers=consumers, ttl=ttl)
        self.now = now
        if req_id in self.leases:
            n = staged["readers"] if staged is not None else None
            self.readers[req_id] = consumers if n is None else n
        return out

    def transfer_done(
        self, req_id: str, *, now: float, readers: int | None = None
    ) -> Release | TransferCounted | LateTransfer | None:
        if readers is not None and not _count(readers):
            raise LocalProtocolError(f"readers={readers!r}")
        self._advance(now)
        if req_id in self.leases:
            self.readers[req_id] = self.leases[req_id]["consumers"] if readers is None else readers
        return super().transfer_done(req_id, now=now, readers=readers)

    def abort(self, req_id: str, *, now: float) -> Release | None:
        self._advance(now)
        return super().abort(req_id, now=now)

    def expire(self, *, now: float) -> list[Release]:
        self._advance(now)
        return super().expire(now=now)

    def renew(self, req_ids: Any, *, now: float, lost: list[str] | None = None) -> int:
        self._advance(now)
        return super().renew(req_ids, now=now, lost=lost)

    def renew_heartbeat(
        self, payload: bytes, *, now: float, lost: list[str] | None = None
    ) -> list[str] | None:
        """A heartbeat's payload (bytes) renewed as :meth:`renew` does; ``None``, and
        nothing changed, for any other payload (spec §3.5: dropped)."""
        msg = naive_wire.decode(payload) if type(payload) is bytes else None
        if msg is None or msg[0] != "heartbeat":
            return None
        ids = list(msg[1])
        self.renew(ids, now=now, lost=lost)
        return ids

    def lost_reason(self, req_id: str, *, now: float) -> ReleaseReason | None:
        if not _finite(now):
            raise LocalProtocolError(f"now={now!r}")
        return super().lost_reason(req_id, now=now)

    def lease_info(self, req_id: str) -> dict[str, Any] | None:
        lease = self.leases.get(req_id)
        if lease is None:
            return None
        fields = ("granted_at", "deadline", "cap_at", "consumers", "done", "last_renewal")
        return {**{k: lease[k] for k in fields}, "readers": self.readers[req_id]}
