"""A naive model of the prefill side: one dict, a full scan on every reap.

Written plainly from the spec's prose (§6, §8.1-8.5), without the rules of
:mod:`leaseproto.core.rules`, so that agreement with :class:`~leaseproto.LeaseTable`
means something. Slow on purpose. It is the oracle of two checks: the hypothesis
machine (:mod:`leaseproto.testing.machine`) and trace validation, which replays
each prefill rank's inputs through it (:mod:`.trace_rules`), so that a bug of the
table is not in both the worker and its validator.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.config import LeaseConfig
from ..core.events import LateTransfer, Release, ReleaseReason, TransferCounted

__all__ = ["NaiveLeaseTable"]


class NaiveLeaseTable:
    """Same API and return values as :class:`~leaseproto.LeaseTable`."""

    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self.leases: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, tuple[ReleaseReason, float]] = {}
        self.staged: dict[str, dict[str, Any]] = {}
        self.counts: dict[str, int] = {}
        self.grants = 0  # grant order breaks ties between equal deadlines

    def _count(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def _release(self, req_id: str, reason: ReleaseReason, now: float) -> Release:
        lease = self.leases.pop(req_id)
        self.ended.pop(req_id, None)
        self.ended[req_id] = (reason, now)
        while len(self.ended) > self.config.tombstone_capacity:
            del self.ended[next(iter(self.ended))]
        self._count("released_" + reason.value)
        return Release(
            req_id,
            reason,
            now,
            granted_at=lease["granted_at"],
            deadline=lease["deadline"],
            last_renewal=lease["last_renewal"],
        )

    def _stage(self, req_id: str, now: float, abort: bool, readers: int | None = None) -> None:
        if req_id not in self.staged:
            if self.config.staging_capacity == 0:
                self._count("early_dropped")
                return
            if len(self.staged) >= self.config.staging_capacity:
                del self.staged[next(iter(self.staged))]
                self._count("early_dropped")
            self.staged[req_id] = {"first": now, "transfers": 0, "abort": False, "readers": None}
        if abort:
            self.staged[req_id]["abort"] = True
        else:
            self.staged[req_id]["transfers"] += 1
            if readers is not None:  # the latest notification's n decides
                self.staged[req_id]["readers"] = readers
        self._count("early_staged")

    def grant(
        self, req_id: str, *, now: float, consumers: int = 1, ttl: float | None = None
    ) -> Release | None:
        assert req_id not in self.leases
        ttl = self.config.kv_lease_duration if ttl is None else ttl
        cap = self.config.max_lease_lifetime
        self.ended.pop(req_id, None)
        self.grants += 1
        self.leases[req_id] = {
            "granted_at": now,
            "deadline": now + ttl,
            "consumers": consumers,
            "done": 0,
            "last_renewal": None,
            "seq": self.grants,
            "cap_at": None if cap is None else now + cap,
        }
        self._count("granted")
        early = self.staged.pop(req_id, None)
        if early is None:
            return None
        self._count("early_applied")
        if early["abort"]:
            return self._release(req_id, ReleaseReason.ABORTED, now)
        lease = self.leases[req_id]
        readers = consumers if early["readers"] is None else early["readers"]
        lease["done"] = min(early["transfers"], readers)
        if early["transfers"] >= readers:
            return self._release(req_id, ReleaseReason.TRANSFERRED, now)
        return None

    def renew(self, req_ids: Iterable[str], *, now: float, lost: list[str] | None = None) -> int:
        """``lost`` receives the ids whose lease is gone for good: ended by expiry or
        abort (remembered), or lapsed and not yet reaped (spec §8.2)."""
        n = 0
        for rid in req_ids:
            lease = self.leases.get(rid)
            if lease is None:
                self._count("renew_late" if rid in self.ended else "renew_unknown")
                gone = self.ended.get(rid)
                if (
                    lost is not None
                    and gone is not None
                    and gone[0] is not ReleaseReason.TRANSFERRED
                ):
                    lost.append(rid)
            elif now >= lease["deadline"]:
                self._count("renew_lapsed")
                if lost is not None:
                    lost.append(rid)
            else:
                target = now + self.config.lease_extension
                if lease["cap_at"] is not None and target > lease["cap_at"]:
                    target = lease["cap_at"]
                lease["deadline"] = max(lease["deadline"], target)
                lease["last_renewal"] = now
                n += 1
        self._count("renewed", n)
        return n

    def transfer_done(
        self, req_id: str, *, now: float, readers: int | None = None
    ) -> Release | TransferCounted | LateTransfer | None:
        lease = self.leases.get(req_id)
        if lease is not None:
            # n from the wire, when the notification carries one, decides
            n = lease["consumers"] if readers is None else readers
            lease["done"] += 1
            if lease["done"] >= n:
                return self._release(req_id, ReleaseReason.TRANSFERRED, now)
            return TransferCounted(req_id, now, done=lease["done"], readers=n)
        if req_id in self.ended:
            # ended any way, completed by earlier transfer-dones included: late
            reason, at = self.ended[req_id]
            self._count(
                "excess_transfers" if reason is ReleaseReason.TRANSFERRED else "late_transfers"
            )
            return LateTransfer(req_id, reason, now, ended_at=at)
        self._stage(req_id, now, abort=False, readers=readers)
        return None

    def abort(self, req_id: str, *, now: float) -> Release | None:
        if req_id in self.leases:
            return self._release(req_id, ReleaseReason.ABORTED, now)
        if req_id in self.ended:
            self._count("late_aborts")
        else:
            self._stage(req_id, now, abort=True)
        return None

    def expire(self, *, now: float) -> list[Release]:
        due = sorted(
            (lease["deadline"], lease["seq"], rid)
            for rid, lease in self.leases.items()
            if lease["deadline"] <= now
        )
        out = [self._release(rid, ReleaseReason.EXPIRED, now) for _, _, rid in due]
        for rid, (_, at) in list(self.ended.items()):
            if at + self.config.tombstone_ttl <= now:
                del self.ended[rid]
        for rid, early in list(self.staged.items()):
            if early["first"] + self.config.staging_ttl <= now:
                del self.staged[rid]
                self._count("early_dropped")
        return out

    def deadline(self, req_id: str) -> float | None:
        lease = self.leases.get(req_id)
        return None if lease is None else float(lease["deadline"])

    def lost_reason(self, req_id: str, *, now: float) -> ReleaseReason | None:
        """Why no lease of ``req_id`` is held at ``now``: how it ended, EXPIRED for
        a lapsed one, None when held or unknown."""
        lease = self.leases.get(req_id)
        if lease is not None:
            return ReleaseReason.EXPIRED if lease["deadline"] <= now else None
        gone = self.ended.get(req_id)
        return None if gone is None else gone[0]

    def next_deadline(self) -> float | None:
        return min((float(x["deadline"]) for x in self.leases.values()), default=None)

    def __len__(self) -> int:
        return len(self.leases)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self.leases
