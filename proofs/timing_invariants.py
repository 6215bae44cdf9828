"""The invariants of the composed timing systems (:mod:`proofs.timing_model`), by the
spec's ids: the lemmas L1-L10 and I5-I8, I11, I13 that :mod:`proofs.timing` states
(its docstring, with the assumptions T1/T2) and proves for every transition.

:func:`invariants_for` gives one system's list (L6, L7 and I8 with ``schedule``, I7 and
L8 with ``cap``, L9 and I6 after silence with ``bounded``); :func:`read_invariants` gives
L10 and I13 for a system built with ``reads=True``.
"""

from __future__ import annotations

from typing import Any

import z3

from .invariants import Invariant
from .model import ABSENT, EXPIRED, GRANTED, ended
from .timing_state import hq, vmax

__all__ = ["invariants_for", "next_renewal_by", "read_invariants", "reclaim_by"]


def _w(p: Any) -> Any:
    return p.SD + p.dl + p.SP


def next_renewal_by(s: Any, p: Any) -> Any:
    """``B``: by when P applies a heartbeat D sends on its schedule."""
    return z3.If(s.renewed, s.tr + hq(p) + _w(p), s.tg + p.R + vmax(p.K, hq(p)) + _w(p))


def reclaim_by(s: Any, p: Any) -> Any:
    """``X``: by when the lease is due on P's clock, in real time."""
    lo = 1 - p.rho
    granted = s.tg + p.L / lo
    return z3.If(s.hash, vmax(granted, s.th + p.E / lo), granted)


def _steps_and_clocks(s: Any, p: Any) -> Any:
    lo, hi = 1 - p.rho, 1 + p.rho
    return z3.And(
        s.lastP <= s.tau,
        s.tau <= s.lastP + p.SP,
        s.lastDs <= s.tau,
        z3.Implies(z3.Not(s.silent), s.tau <= s.lastDs + p.SD),
        z3.Implies(s.silent, s.tsil <= s.tau),
        z3.Implies(
            s.st != ABSENT,
            z3.And(
                s.tg <= s.tau,
                lo * (s.tau - s.tg) <= s.cP - s.cg,
                s.cP - s.cg <= hi * (s.tau - s.tg),
            ),
        ),
        z3.Implies(s.st == ABSENT, z3.And(z3.Not(s.tracked), z3.Not(s.hash))),
        z3.Implies(s.hash, z3.And(s.tg <= s.th, s.th <= s.tau, s.cP - s.ch >= lo * (s.tau - s.th))),
    )


def _engine(s: Any, p: Any) -> Any:
    lo = 1 - p.rho
    return z3.And(
        z3.Implies(s.tracked, z3.And(s.tg <= s.ttrack, s.ttrack <= s.tau, s.ttrack <= s.tg + p.R)),
        z3.Implies(
            z3.And(z3.Not(s.tracked), z3.Not(s.silent), s.st != ABSENT), s.tau <= s.tg + p.R
        ),
        z3.Implies(
            z3.And(s.tracked, z3.Not(s.conn)),
            z3.And(
                z3.Not(s.hasD), z3.Not(s.out), z3.Implies(z3.Not(s.silent), s.tau <= s.ttrack + p.K)
            ),
        ),
        z3.Implies(s.hasD, z3.And(s.tsD <= s.tau, s.cD - s.lastD >= lo * (s.tau - s.tsD))),
        z3.Implies(
            z3.And(s.tracked, s.hasD),
            z3.And(s.conn, s.tsD <= s.lastDs, lo * (s.lastDs - s.tsD) < p.H),
        ),
        z3.Implies(z3.Not(s.tracked), z3.And(z3.Not(s.out), z3.Not(s.renewed), z3.Not(s.hasO))),
    )


def _in_flight(s: Any, p: Any) -> Any:
    hi = 1 + p.rho
    return z3.And(
        z3.Implies(
            s.out,
            z3.And(
                s.tracked,
                s.hasD,
                s.hasO,
                s.ttrack <= s.tout,
                s.tout <= s.tsD,
                s.tout <= s.tso,
                s.tau <= s.tout + p.dl + p.SP,
            ),
        ),
        z3.Implies(s.hasO, z3.And(s.tracked, s.hasD, s.ttrack <= s.tso, s.tso <= s.tsD)),
        z3.Implies(s.arr, z3.And(s.out, s.tout <= s.tarr, s.tarr <= s.tau)),
        z3.Implies(
            s.renewed,
            z3.And(
                s.tracked, s.hasD, s.tg <= s.tr, s.tr <= s.tau, s.cP - s.cr <= hi * (s.tau - s.tr)
            ),
        ),
        z3.Implies(z3.And(s.renewed, z3.Not(s.out)), s.tsD <= s.tr),
        z3.Implies(z3.And(z3.Not(s.renewed), s.tracked, z3.Not(s.out), s.hasD), s.tsD <= s.ttrack),
    )


def _schedule(s: Any, p: Any) -> Any:
    b = next_renewal_by(s, p)
    return z3.Implies(
        z3.Not(s.silent),
        z3.And(
            z3.Implies(z3.And(s.tracked, s.out), s.tout + p.dl + p.SP <= b),
            z3.Implies(
                z3.And(s.tracked, s.conn, z3.Not(s.out), z3.Not(s.hasD)), s.lastDs + _w(p) <= b
            ),
            z3.Implies(
                z3.And(s.tracked, s.conn, z3.Not(s.out), s.hasD), s.tsD + hq(p) + _w(p) <= b
            ),
            z3.Implies(z3.And(s.tracked, z3.Not(s.conn)), s.ttrack + p.K + _w(p) <= b),
            z3.Implies(s.st != ABSENT, s.tau <= b),
        ),
    )


def _covers(s: Any, p: Any) -> Any:
    hi = 1 + p.rho
    return z3.And(
        z3.Implies(s.st == GRANTED, s.deadline >= s.cg + p.L),
        z3.Implies(z3.And(s.st == GRANTED, s.renewed, z3.Not(s.silent)), s.deadline >= s.cr + p.E),
        z3.Implies(
            z3.And(s.st == GRANTED, z3.Not(s.silent)),
            s.cP + hi * (next_renewal_by(s, p) - s.tau) < s.deadline,
        ),
    )


def _p_clock_bound(s: Any, p: Any) -> Any:
    bound = z3.If(s.hash, vmax(s.cg + p.L, s.ch + p.E), s.cg + p.L)
    return z3.Implies(s.st == GRANTED, s.deadline <= bound)


def _cap_bound(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(s.st != ABSENT, s.cap_at == s.cg + p.C),
        z3.Implies(s.st == GRANTED, s.deadline <= s.cg + vmax(p.L, p.C)),
    )


def _reaped(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s.lastP < reclaim_by(s, p))


def _i6(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s.tau < reclaim_by(s, p) + p.SP)


def _i5(s: Any, p: Any) -> Any:
    return z3.Implies(
        z3.And(s.st == GRANTED, z3.Not(s.hash)), s.tau < s.tg + p.L / (1 - p.rho) + p.SP
    )


def _i7(s: Any, p: Any) -> Any:
    bound = s.tg + vmax(p.L, p.C) / (1 - p.rho)
    return z3.Implies(s.st == GRANTED, z3.And(s.lastP < bound, s.tau < bound + p.SP))


def _silent_th(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(z3.And(s.silent, s.hasO), s.tso <= s.tsil),
        z3.Implies(z3.And(s.silent, s.hash), s.th <= s.tsil + p.dl + p.SP),
    )


def _i6_silent(s: Any, p: Any) -> Any:
    lo = 1 - p.rho
    bound = vmax(s.tg + p.L / lo, s.tsil + p.dl + p.SP + p.E / lo) + p.SP
    return z3.Implies(z3.And(s.silent, s.st == GRANTED), s.tau < bound)


def _i11(s: Any, p: Any) -> Any:
    return z3.Implies(z3.And(s.tracked, s.hasD, z3.Not(s.silent)), s.tau < s.tsD + hq(p) + p.SD)


def _i8(s: Any, p: Any) -> Any:
    return z3.Implies(z3.Not(s.silent), s.st != EXPIRED)


def _reads(s: Any, p: Any) -> Any:
    return z3.And(
        s.rd >= 0,
        s.rd <= 2,
        s.done >= 0,
        z3.Implies(s.rd == 0, z3.Not(z3.Or(s.rbad, s.okv, s.nkv, s.used))),
        z3.Implies(s.rd == 1, z3.Not(z3.Or(s.rbad, s.okv, s.nkv, s.used))),
        z3.Implies(s.rd >= 1, s.st != ABSENT),
        z3.Implies(s.rbad, ended(s.st)),
    )


def _i13(s: Any, p: Any) -> Any:
    return z3.And(z3.Implies(s.okv, z3.Not(s.rbad)), z3.Implies(s.used, z3.Not(s.rbad)))


def _i13_verdict(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    if t.name != "p_td":
        return z3.BoolVal(True)
    return out["ok"] == (s.st == GRANTED)


def _inv(iid: str, system: str, text: str, pred: Any) -> Invariant:
    return Invariant(iid, system, "state", text, pred)


def read_invariants(name: str) -> list[Invariant]:
    """I13 and its lemma, for a system built with ``reads=True``."""
    return [
        _inv("L10", name, "D's read: started after the grant; bad only if the lease ended", _reads),
        _inv(
            "I13",
            name,
            "verified reads: an OK is never sent for, and D never uses, a read that "
            "overlapped the lease's end (any readers n, duplicated or replayed "
            "transfer-dones, aborts)",
            _i13,
        ),
        Invariant(
            "I13",
            name,
            "step",
            "every transfer-done P handles is answered OK exactly when the lease is "
            "live (GRANTED), NK after it ended",
            _i13_verdict,
        ),
    ]


def invariants_for(
    name: str, cap: bool = False, bounded: bool = False, schedule: bool = True
) -> list[Invariant]:
    """The invariants of one composed system."""
    invs = [
        _inv(
            "L1", name, "steps are at most S_P / S_D apart; clocks within drift", _steps_and_clocks
        ),
        _inv(
            "L2",
            name,
            "D's engine: tracked within R, connected within K, never "
            "overdue after a step (I11 in real time)",
            _engine,
        ),
        _inv("L3", name, "the oldest unprocessed heartbeat and the last applied one", _in_flight),
        _inv("L4", name, "P's deadline on its clock: max(cg + L, ch + E)", _p_clock_bound),
        _inv("L5", name, "P's last step came before the lease was due", _reaped),
        _inv(
            "I11",
            name,
            "while D steps, a tracked engine's last heartbeat is always less "
            "than H/(1-rho) + S_D old (real time)",
            _i11,
        ),
        _inv("I5", name, "without renewals the lease is freed by tg + L/(1-rho) + S_P", _i5),
        _inv("I6", name, "the lease is freed by max(tg + L/(1-rho), th + E/(1-rho)) + S_P", _i6),
    ]
    if schedule:
        invs += [
            _inv("L6", name, "D's next heartbeat is applied by B", _schedule),
            _inv("L7", name, "the deadline outlasts B on P's clock", _covers),
            _inv("I8", name, "while D has not gone silent the lease is never EXPIRED", _i8),
        ]
    if cap:
        invs.append(
            _inv("I7", name, "with a cap the lease is freed by tg + max(L, C)/(1-rho) + S_P", _i7)
        )
        invs.append(_inv("L8", name, "cap_at = cg + C; deadline <= cg + max(L, C)", _cap_bound))
    if bounded:
        invs.append(
            _inv(
                "L9",
                name,
                "after silence, P applies no heartbeat later than tsil + dl + S_P",
                _silent_th,
            )
        )
        invs.append(
            _inv(
                "I6",
                name,
                "after D goes silent at tsil, the lease is freed by "
                "max(tg + L/(1-rho), tsil + dl + S_P + E/(1-rho)) + S_P",
                _i6_silent,
            )
        )
    return invs
