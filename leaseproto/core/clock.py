"""Clock-offset estimation for the bidirectional read gate (spec §8.7, I9).

Deadlines stamped on another process's clock must never be compared with ours
directly (upstream bug B3). During the handshake we note our send time ``t0``,
the peer's clock reading ``T`` and our receive time ``t1``. ``T`` was read
somewhere inside ``[t0, t1]`` of our clock, so the peer-minus-local offset lies
within ``T - (t0 + t1) / 2 ± (t1 - t0) / 2``. Of all samples the one with the
lowest round trip gives the tightest bound and is kept (NTP's rule).
"""

from __future__ import annotations

import math

from . import rules as R

__all__ = ["ClockOffset"]


class ClockOffset:
    """The peer's clock minus ours, with its uncertainty."""

    __slots__ = ("_offset", "_rtt", "samples")

    def __init__(self) -> None:
        self._offset: float | None = None
        self._rtt = math.inf
        self.samples = 0

    def add_sample(self, *, t0: float, remote_time: float, t1: float) -> bool:
        """Record one handshake sample; returns whether it became the best.

        Raises:
            ValueError: a non-finite value, or ``t1 < t0``. Nothing changes.
        """
        for name, v in (("t0", t0), ("remote_time", remote_time), ("t1", t1)):
            if not math.isfinite(v):
                raise ValueError(f"{name}={v!r} must be finite")
        if t1 < t0:
            raise ValueError(f"t1={t1!r} is before t0={t0!r}")
        self.samples += 1
        rtt = t1 - t0
        if rtt >= self._rtt:
            return False
        self._rtt = rtt
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
        """Half the best round trip: the true offset is within ``offset ± this``."""
        if self._offset is None:
            raise ValueError("no clock sample yet")
        return self._rtt / 2

    def to_local(self, remote_time: float) -> float:
        """A peer-clock instant on our clock (midpoint estimate)."""
        return remote_time - self.offset

    def read_allowed(self, remote_deadline: float, *, now: float, margin: float = 5.0) -> bool:
        """Whether reading the peer's blocks, whose deadline is on the peer's
        clock, is safe at local ``now``: ``now + margin + uncertainty <
        remote_deadline - offset``. ``False`` without a sample."""
        if self._offset is None:
            return False
        return R.read_allowed(remote_deadline, now, self._offset, self._rtt / 2, margin)
