"""Renewals on P (spec §8.2): :meth:`renew` and the heartbeat path that decodes
and renews in one pass (:meth:`renew_heartbeat`), as a part of
:class:`~leaseproto.core.table.LeaseTable`.

Both run :func:`renew_ids`: :func:`.rules.renew_rule` written out as loops over the
ids (one for a heartbeat naming only live leases, one with caps, one for the rest),
proven equal to the rule by ``leaseproto prove`` (lemma L14), which runs this
module's loops on z3 terms.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import rules as R
from .config import LeaseConfig
from .lease import Lease
from .wire_ids import id_problem

__all__ = ["Renewals"]  # and the loops, for proofs/loops.py

_INF = math.inf
_NINF = -math.inf


class Renewals:
    """The renewal methods of :class:`~leaseproto.core.table.LeaseTable`."""

    config: LeaseConfig
    _extension: float  # config.lease_extension
    _cap: float | None  # config.max_lease_lifetime
    _leases: dict[str, Lease]
    _ended: OrderedDict[str, tuple[int, float]]
    _c: dict[str, int]
    _last_now: float
    _clock: Callable[[float], None]  # the table's: advances its clock to now, or raises

    def renew(self, req_ids: Iterable[str], *, now: float, lost: list[str] | None = None) -> int:
        """Apply one heartbeat: every live lease named gets
        ``deadline = max(deadline, min(now + lease_extension, granted_at + cap))``.

        Unknown, ended and lapsed ids are ignored and counted; a renewal never
        creates or revives a lease. Returns how many leases were renewed.

        ``lost``, when given, receives the ids whose lease is gone for good:
        ended by expiry or abort, or lapsed (``deadline <= now``) and about to
        be reaped. D still heartbeats them, so it has not read them yet: the
        caller can nack them and D fails over before it reads reused blocks.
        """
        if type(now) is float and _NINF < self._last_now <= now < _INF:  # advance(), inline
            self._last_now = now
        else:
            self._clock(now)  # the first call, a now that is not a float, or raises
        ids = req_ids if type(req_ids) is list or type(req_ids) is tuple else list(req_ids)
        found = list(map(self._leases.get, ids))
        c = self._c
        renewed = renew_ids(
            ids, found, all(found), self._ended, now, self._extension, self._cap, lost, c
        )
        c["renewed"] += renewed
        return renewed

    def renew_heartbeat(
        self, payload: bytes, *, now: float, lost: list[str] | None = None
    ) -> list[str] | None:
        """``wire.decode`` and :meth:`renew` of one heartbeat payload in one pass,
        for P's notification loop: returns the ids as the decoded
        :class:`~leaseproto.wire.Heartbeat` names them, having renewed them as
        :meth:`renew` does; ``None`` (nothing changed) when the payload is not
        one this path can take: not a UTF-8 ``HB:`` payload, or naming an id
        that the per-id checks of ``decode`` would refuse. The caller then runs
        ``decode`` (which words the error) and :meth:`renew`.

        Only ids naming no live lease and no tombstone are checked here: every
        other one is a key :meth:`grant` validated (``check_wire_id``: what
        ``decode`` checks, and at most ``max_id_bytes``), so ``decode`` accepts
        exactly the payloads this takes (``tests/test_hot_paths.py``).

        Raises:
            LocalProtocolError: ``now`` is not finite or went back (nothing changes).
        """
        if type(payload) is not bytes or not payload.startswith(b"HB:"):
            return None
        try:
            ids = payload.decode().split(",")
        except UnicodeDecodeError:
            return None
        ids[0] = ids[0][3:]  # the prefix
        found = list(map(self._leases.get, ids))
        every = all(found)
        if not every and not self._known_or_valid(ids, found):
            return None
        if type(now) is float and _NINF < self._last_now <= now < _INF:  # advance(), inline
            self._last_now = now
        else:
            self._clock(now)  # the first call, a now that is not a float, or raises
        c = self._c
        c["renewed"] += renew_ids(
            ids, found, every, self._ended, now, self._extension, self._cap, lost, c
        )
        return ids

    def _known_or_valid(self, ids: list[str], found: list[Lease | None]) -> bool:
        ended = self._ended
        for rid, lease in zip(ids, found, strict=True):
            if lease is None and rid not in ended and id_problem(rid) is not None:
                return False
        return True


# -- the loops (spec §8.2), ordinary code: ``proofs/loops.py`` runs them on z3 terms ---------
# Each is :func:`.rules.renew_rule` for the leases of the table's live map, which are all
# GRANTED (the table takes a lease out of the map before it sets an end state;
# ``tests/test_hot_paths.py`` checks it over random histories), so ``state == GRANTED`` is
# not tested again: a renewal applies exactly when ``now < deadline``. ``prove`` (lemma L14)
# shows each loop, run on symbolic values, does what the rules say for every id: the
# deadline and last renewal it stores, the counters, the ids it reports lost
# (:func:`.rules.renew_lost`) and the count it returns.
def renew_ids(  # noqa: PLR0917 - the loop's inputs, in one call
    ids: Sequence[str],
    found: Sequence[Lease | None],
    every: bool,
    ended: Mapping[str, tuple[int, float]],
    now: float,
    extension: float,
    cap: float | None,
    lost: list[str] | None,
    c: dict[str, int],
) -> int:
    """Renew each of ``ids`` (``found``: its live lease, or ``None``; ``every``: none is
    ``None``) and return how many were renewed. ``ended`` holds the tombstones, ``cap``
    is ``max_lease_lifetime`` (a lease's cap is ``granted_at + cap``, as ``grant``
    computes it), ``c`` the counters."""
    target = now + extension
    if every:  # every id names a live lease (the common heartbeat): no test for None
        live: Sequence[Lease] = found  # type: ignore[assignment]  # none is None
        if cap is not None:
            return renew_capped(live, now, extension, cap, lost, c)
        lapsed = 0
        for held in live:
            deadline = held.deadline
            if now < deadline:
                held.deadline = deadline if deadline >= target else target  # vmax (I1)
                held.last_renewal = now
                continue
            lapsed += 1
            _lapsed(held.req_id, lost, c)
        return len(live) - lapsed
    renewed = 0
    for rid, lease in zip(ids, found, strict=True):
        if lease is None:  # no live lease: never created or revived (I2)
            tomb = ended.get(rid)
            if tomb is None:
                c["renew_unknown"] += 1
                continue
            c["renew_late"] += 1
            if lost is not None and tomb[0] != R.TRANSFERRED:  # expired or aborted
                lost.append(rid)
            continue
        deadline = lease.deadline
        if now < deadline:
            new = target
            if cap is not None:
                cap_at = lease.granted_at + cap
                new = new if new <= cap_at else cap_at  # vmin: never past the cap (I7)
            lease.deadline = deadline if deadline >= new else new  # vmax: never shorter (I1)
            lease.last_renewal = now
            renewed += 1
            continue
        _lapsed(rid, lost, c)  # due, not yet reaped: not revived (I2)
    return renewed


def renew_capped(  # noqa: PLR0917
    leases: Sequence[Lease],
    now: float,
    extension: float,
    cap: float,
    lost: list[str] | None,
    c: dict[str, int],
) -> int:
    """:func:`renew_ids`'s common loop when each lease has a cap (``granted_at + cap``)."""
    target = now + extension
    lapsed = 0
    for lease in leases:
        deadline = lease.deadline
        if now < deadline:
            cap_at = lease.granted_at + cap
            new = target if target <= cap_at else cap_at  # vmin: never past the cap (I7)
            lease.deadline = deadline if deadline >= new else new  # vmax (I1)
            lease.last_renewal = now
            continue
        lapsed += 1
        _lapsed(lease.req_id, lost, c)
    return len(leases) - lapsed


def _lapsed(rid: str, lost: list[str] | None, c: dict[str, int]) -> None:
    """A live lease past its deadline, not yet reaped: counted, and reported lost."""
    c["renew_lapsed"] += 1
    if lost is not None:
        lost.append(rid)
