"""Renewals on P (spec §8.2): :meth:`renew` and the heartbeat path that decodes
and renews in one pass (:meth:`renew_heartbeat`), as a part of
:class:`~leaseproto.core.table.LeaseTable`.

Both run the loop :mod:`.specialise` generates from :func:`.rules.renew_rule`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from . import rules as R
from . import specialise
from .config import LeaseConfig
from .lease import Lease
from .wire import id_problem

__all__ = ["Renewals"]

_INF = math.inf
_NINF = -math.inf


class Renewals:
    """The renewal methods of :class:`~leaseproto.core.table.LeaseTable`."""

    config: LeaseConfig
    _leases: dict[str, Lease]
    _ended: OrderedDict[str, tuple[int, float]]
    _c: dict[str, int]
    _last_now: float
    _renew_loop: Callable[..., int] | None
    _renew_rule: Callable[..., tuple[bool, float]]  # the rule _renew_loop was built from
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
        self._clock(now)
        ids = req_ids if type(req_ids) is list or type(req_ids) is tuple else list(req_ids)
        found = list(map(self._leases.get, ids))
        return self._renew(ids, found, all(found), now, lost)

    def _renew(
        self,
        ids: Sequence[str],
        found: list[Lease | None],
        every: bool,
        now: float,
        lost: list[str] | None,
    ) -> int:
        """Renew ``ids`` (``found``: their leases or ``None``; ``every``: all found)."""
        loop = self._renew_loop or self._build_renew_loop()
        c = self._c
        ext = self.config.lease_extension
        renewed: int = loop(ids, found, every, self._ended, now, ext, lost, c, self._renew_rule)
        c["renewed"] += renewed
        return renewed

    def _build_renew_loop(self) -> Callable[..., int]:
        capped = self.config.max_lease_lifetime is not None
        self._renew_rule = R.renew_rule
        loop = self._renew_loop = specialise.renew_form(R.renew_rule, capped=capped).fn
        return loop

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
        try:  # advance()'s check, inline (a message is a few microseconds)
            fast = _NINF < self._last_now <= now < _INF and now is not True and now is not False
        except TypeError:
            fast = False
        if not fast:
            self._clock(now)  # the first call, or raises
        self._last_now = now
        loop = self._renew_loop or self._build_renew_loop()  # what _renew does, inline
        c = self._c
        ext = self.config.lease_extension
        c["renewed"] += loop(ids, found, every, self._ended, now, ext, lost, c, self._renew_rule)
        return ids

    def _known_or_valid(self, ids: list[str], found: list[Lease | None]) -> bool:
        ended = self._ended
        for rid, lease in zip(ids, found, strict=True):
            if lease is None and rid not in ended and id_problem(rid) is not None:
                return False
        return True
