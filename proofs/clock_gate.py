"""Lemma L19: the clock-offset estimate and the read gate are spec §8.7, on a bounded set.

``ClockOffset`` (``core/clock.py``) is run on every sequence of up to three handshake
samples drawn from a pool, at ``rho`` 0 and 1/2, and every query is compared with
spec §8.7 computed here in exact rational arithmetic: the kept sample is the one
whose uncertainty, both aged to the later of their ``t0`` (``u + 2 rho/(1 - rho) *
age``), is lowest, a tie keeping the old one; ``offset = T - (t0 + t1)/2``,
``u = (t1 - t0)/2``; ``uncertainty_at(now)`` ages by ``|now - t0|``; the gate admits a
read exactly when ``now + margin + u(now) < T_d - offset``, asked at the boundary and
a quarter second either side of it. Misuse (a non-finite or non-number argument,
``t1 < t0``, ``rho`` outside ``[0, 1)``) is refused and changes nothing; queries
before any sample raise ``ValueError`` (the gate says no).

The pool's times are multiples of a quarter second and ``rho`` is 0 or 1/2 (the drift
factor is then 0 or 2), so every value the code computes is a double exactly equal
to the spec's rational: the comparison is exact, boundaries included.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from leaseproto.core.clock import ClockOffset
from leaseproto.core.errors import LocalProtocolError

from .codec import _Mismatches, _outcome
from .loops import Check, built

SYSTEM = "clock"
_SAMPLES = [
    (t0, t0 + rtt, remote)
    for t0 in (0.0, 0.5, 1.0, 2.5)
    for rtt in (0.0, 0.5, 2.0)
    for remote in (10.0, -3.25)
]


def _time(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


class SpecClock:
    """Spec §8.7 in exact arithmetic."""

    def __init__(self, rho: Any) -> None:
        if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 <= rho < 1:
            raise LocalProtocolError("rho")
        self.k = 2 * Fraction(rho) / (1 - Fraction(rho))
        self.kept: tuple[Fraction, Fraction, Fraction] | None = None  # (t0, u, offset)
        self.samples = 0

    def add_sample(self, *, t0: Any, remote_time: Any, t1: Any) -> bool:
        if not all(map(_time, (t0, remote_time, t1))) or t1 < t0:
            raise LocalProtocolError("sample")
        self.samples += 1
        a, b, big_t = Fraction(t0), Fraction(t1), Fraction(remote_time)
        new = (a, (b - a) / 2, big_t - (a + b) / 2)
        if self.kept is not None:
            later = max(a, self.kept[0])
            if not new[1] + self.k * (later - a) < self.kept[1] + self.k * (later - self.kept[0]):
                return False
        self.kept = new
        return True

    def _need(self) -> tuple[Fraction, Fraction, Fraction]:
        if self.kept is None:
            raise ValueError("no sample")
        return self.kept

    def uncertainty_at(self, now: Any) -> Fraction:
        if not _time(now):
            raise LocalProtocolError("now")
        t0, u, _ = self._need()
        return u + self.k * abs(Fraction(now) - t0)

    def read_allowed(self, deadline: Any, *, now: Any, margin: Any = 5.0) -> bool:
        if not (_time(now) and _time(deadline) and _time(margin)):
            raise LocalProtocolError("gate")
        if self.kept is None:
            return False
        return Fraction(now) + Fraction(margin) + self.uncertainty_at(now) < (
            Fraction(deadline) - self.kept[2]
        )


def _observe(m: _Mismatches, what: str, code: ClockOffset, spec: SpecClock, *, full: bool) -> None:
    err = (ValueError, LocalProtocolError)
    kept = spec.kept
    m.same(
        f"{what}: samples, has_sample",
        (code.samples, code.has_sample),
        (spec.samples, kept is not None),
    )
    want = "ValueError" if kept is None else (kept[2], kept[1], kept[0])
    got = _outcome(err, lambda: (code.offset, code.uncertainty, code.sampled_at))
    m.same(f"{what}: offset, uncertainty, sampled_at", got, want)
    m.same(
        f"{what}: to_local(7)",
        _outcome(err, code.to_local, 7.0),
        "ValueError" if kept is None else 7 - kept[2],
    )
    for now in (-1.0, 0.0, 1.75, 4.0, math.nan) if full else (1.75,):
        m.same(
            f"{what}: uncertainty_at({now})",
            _outcome(err, code.uncertainty_at, now),
            _outcome(err, spec.uncertainty_at, now),
        )
        for margin in (0.0, 5.0) if full else (5.0,):
            edge = (
                0.0
                if kept is None
                else float(now + margin + spec.uncertainty_at(now) + kept[2])
                if _time(now)
                else 0.0
            )
            for deadline in (edge - 0.25, edge, edge + 0.25, math.inf)[: 4 if full else 3]:
                got = _outcome(err, code.read_allowed, deadline, now=now, margin=margin)
                want_gate = _outcome(err, spec.read_allowed, deadline, now=now, margin=margin)
                m.same(
                    f"{what}: read_allowed({deadline}, now={now}, margin={margin})", got, want_gate
                )


def _sequence(m: _Mismatches, rho: float, seq: Any, bad: Any) -> None:
    """One sequence of samples, every answer compared after it."""
    code, spec = ClockOffset(rho=rho), SpecClock(rho)
    for t0, t1, remote in seq:
        got = code.add_sample(t0=t0, remote_time=remote, t1=t1)
        want = spec.add_sample(t0=t0, remote_time=remote, t1=t1)
        m.same(f"rho={rho} samples {[s[:2] for s in seq]}: add_sample", got, want)
    if len(seq) != 1:
        _observe(m, f"rho={rho} samples {seq}", code, spec, full=not seq)
        return
    err = (ValueError, LocalProtocolError)
    for b0, b1, b_remote in bad:
        got = _outcome(err, code.add_sample, t0=b0, remote_time=b_remote, t1=b1)
        m.same(f"add_sample{(b0, b_remote, b1)}", got, "LocalProtocolError")
    _observe(m, f"rho={rho} after misuse {seq}", code, spec, full=True)


def _runs() -> Check:
    m = _Mismatches()
    err = (ValueError, LocalProtocolError)
    for rho in (-0.1, 1.0, 1.5, True, math.nan, "0"):
        m.same(
            f"ClockOffset(rho={rho!r})", _outcome(err, ClockOffset, rho=rho), "LocalProtocolError"
        )
    bad = [
        (math.nan, 1.0, 1.0),
        (0.0, math.inf, 1.0),
        (0.0, 1.0, True),
        (1.0, 0.0, 0.5),
        ("0", 1.0, 1.0),
    ]
    sequences = [seq for n in range(3) for seq in itertools.product(_SAMPLES, repeat=n)]
    sequences += list(itertools.product(_SAMPLES[::5], repeat=3))
    for rho in (0.0, 0.5):
        for seq in sequences:
            with m.case(f"rho={rho} samples {seq}"):
                _sequence(m, rho, seq, bad)
    return m.check()


def checks(only: str = "") -> list[tuple[str, Check]]:
    todo: list[tuple[str, Callable[[], Check]]] = [
        ("L19 ClockOffset and the read gate = spec §8.7 (I9), exactly", _runs),
    ]
    return [(label, built(label, build)) for label, build in todo if only in label]
