"""Clock-offset estimation for the bidirectional read gate (spec §8.7, I9).

Deadlines stamped on another process's clock must never be compared with ours
directly (upstream bug B3). During the handshake we note our send time ``t0``,
the peer's clock reading ``T`` and our receive time ``t1``. ``T`` was read
somewhere inside ``[t0, t1]`` of our clock, so the peer-minus-local offset lies
within ``T - (t0 + t1) / 2 ± (t1 - t0) / 2`` at that time.

Samples age: clocks drift (A5: each within ``rho`` of real time), so ``age``
seconds after ``t0`` the bound has widened by ``2 rho / (1 - rho) * age``
(:func:`~leaseproto.core.rules.aged_uncertainty`). The kept sample is the one
whose *aged* uncertainty is lowest (NTP's rule with drift): a fresh sample
with a longer round trip replaces an old one once the old one has aged past
it, so refreshing the offset (spec §8.7, SHOULD) actually helps.
"""

from __future__ import annotations

import math

from . import rules as R
from .checks import check_finite
from .errors import LocalProtocolError

__all__ = ["DEFAULT_CLOCK_DRIFT", "ClockOffset"]

#: Default bound on each clock's rate error (A5's rho): 100 ppm.
DEFAULT_CLOCK_DRIFT = 1e-4


class ClockOffset:
    """The peer's clock minus ours, with its uncertainty (growing with age)."""

    __slots__ = ("_at", "_offset", "_rtt", "rho", "samples")

    def __init__(self, *, rho: float = DEFAULT_CLOCK_DRIFT) -> None:
        """``rho``: the bound on each clock's rate error, ``0 <= rho < 1``.

        Raises:
            LocalProtocolError: ``rho`` out of range or not a number.
        """
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 <= rho < 1:
            raise LocalProtocolError(f"rho={rho!r} must be a number in [0, 1)")
        self.rho = float(rho)
        self._offset: float | None = None
        self._rtt = math.inf
        self._at = 0.0  # t0 of the kept sample
        self.samples = 0

    def add_sample(self, *, t0: float, remote_time: float, t1: float) -> bool:
        """Record one handshake sample; returns whether it is now the one kept:
        its uncertainty is lower than the kept one's, both aged to the later of
        their ``t0``.

        Raises:
            LocalProtocolError: a non-finite value, or ``t1 < t0``. Nothing changes.
        """
        for name, v in (("t0", t0), ("remote_time", remote_time), ("t1", t1)):
            check_finite(name, v)
        if t1 < t0:
            raise LocalProtocolError(f"t1={t1!r} is before t0={t0!r}")
        self.samples += 1
        rtt = t1 - t0
        if self._offset is not None:
            kept, new = self._rtt / 2, rtt / 2
            if t0 >= self._at:
                better = new < R.aged_uncertainty(kept, t0 - self._at, self.rho)
            else:  # an older sample, delivered late: age it to the kept one's time
                better = R.aged_uncertainty(new, self._at - t0, self.rho) < kept
            if not better:
                return False
        self._rtt = rtt
        self._at = t0
        self._offset = remote_time - (t0 + t1) / 2
        return True

    @property
    def has_sample(self) -> bool:
        return self._offset is not None

    @property
    def offset(self) -> float:
        """Peer clock minus local clock, seconds.

        Raises:
            ValueError: no sample yet.
        """
        if self._offset is None:
            raise ValueError("no clock sample yet")
        return self._offset

    @property
    def uncertainty(self) -> float:
        """Half the kept sample's round trip: the true offset was within
        ``offset ± this`` when the sample was taken (see :meth:`uncertainty_at`)."""
        if self._offset is None:
            raise ValueError("no clock sample yet")
        return self._rtt / 2

    @property
    def sampled_at(self) -> float:
        """``t0`` of the kept sample, on our clock."""
        if self._offset is None:
            raise ValueError("no clock sample yet")
        return self._at

    def uncertainty_at(self, now: float) -> float:
        """The bound on the offset at local ``now``: :attr:`uncertainty` plus
        the drift allowance ``2 rho / (1 - rho) * |now - t0|``.

        Raises:
            ValueError: no sample yet.
            LocalProtocolError: ``now`` is not finite.
        """
        check_finite("now", now)
        return R.aged_uncertainty(self.uncertainty, abs(now - self.sampled_at), self.rho)

    def to_local(self, remote_time: float) -> float:
        """A peer-clock instant on our clock (midpoint estimate)."""
        return remote_time - self.offset

    def read_allowed(self, remote_deadline: float, *, now: float, margin: float = 5.0) -> bool:
        """Whether reading the peer's blocks, whose deadline is on the peer's
        clock, is safe at local ``now``: ``now + margin + uncertainty_at(now) <
        remote_deadline - offset``. ``False`` without a sample.

        Raises:
            LocalProtocolError: ``now``, ``remote_deadline`` or ``margin`` is
                not finite.
        """
        check_finite("now", now)
        check_finite("remote_deadline", remote_deadline)
        check_finite("margin", margin)
        if self._offset is None:
            return False
        return R.read_allowed(remote_deadline, now, self._offset, self.uncertainty_at(now), margin)
