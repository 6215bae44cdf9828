"""The invariants of the per-lease and per-engine models, by the spec's ids.

``INVARIANTS`` lists ``(id, system, kind, text, pred)`` tuples:

* ``kind == "state"``: ``pred(s, p)`` over one state; proven initial and
  inductive (every transition preserves it, assuming all state invariants of
  its system before the step).
* ``kind == "step"``: ``pred(s, s2, a, p, t=..., out=...)`` over a step of transition
  ``t`` with arguments ``a`` and outputs ``out``; proven for every transition
  from any state satisfying the state invariants.

Ids ``L...`` are supporting lemmas (the strengthening that makes the named
invariants inductive), not spec invariants. I8, I11's real-time form and the
reclaim bounds with delays and drift are in :mod:`proofs.timing`; I9 is the
``gate`` theorems of :mod:`proofs.model` and :mod:`proofs.timing`.

I12 is added here (reported to the lead): *P never expires a lease before its
deadline on P's own clock* — the P-side half of I8.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import z3

from .model import ABSENT, EXPIRED, GRANTED, STATE_NAMES, TRANSFERRED, ended


class Invariant(NamedTuple):
    id: str
    system: str
    kind: str
    text: str
    pred: Any


def _both(name: str, kind: str, text: str, pred: Any) -> list[Invariant]:
    return [
        Invariant(name, "lease", kind, text, pred),
        Invariant(name, "lease-cap", kind, text, pred),
    ]


def _wf(s: Any, p: Any) -> Any:
    live_or_ended = s.st != ABSENT
    return z3.And(
        s.st >= min(STATE_NAMES),
        s.st <= max(STATE_NAMES),
        s.swept <= s.now,
        z3.Implies(s.st == ABSENT, z3.And(s.done == 0, z3.Not(s.has_lr))),
        z3.Implies(
            live_or_ended, z3.And(s.consumers >= 1, s.ttl > 0, s.done >= 0, s.granted_at <= s.now)
        ),
        z3.Implies(s.has_lr, z3.And(s.granted_at <= s.lr, s.lr <= s.now)),
        z3.Implies(ended(s.st), z3.And(s.granted_at <= s.ended_at, s.ended_at <= s.now)),
    )


def _cap_wf(s: Any, p: Any) -> Any:
    return z3.Implies(s.st != ABSENT, s.cap_at == s.granted_at + p.C)


def _i1(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s2.deadline >= s.deadline)


def _i2(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    parts = [
        z3.Implies(
            ended(s.st), z3.And(s2.st == s.st, s2.deadline == s.deadline, s2.done == s.done)
        ),
        z3.Implies(s2.st == GRANTED, s.st == GRANTED) if t.name != "grant" else True,
    ]
    if t.name != "grant":
        parts.append(z3.Implies(s.st == ABSENT, s2.st == ABSENT))
    return z3.And(*parts)


def _i3(s: Any, p: Any) -> Any:
    return z3.And(s.released == z3.If(ended(s.st), 1, 0), s.grants == z3.If(s.st == ABSENT, 0, 1))


def _i4(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s.deadline > s.swept)


def _ends_by(s: Any, bound: Any) -> Any:
    """Its deadline is within ``bound``, and no expire at or after ``bound`` left it live."""
    return z3.And(s.deadline <= bound, s.swept < bound)


def _i5(s: Any, p: Any) -> Any:
    return z3.Implies(z3.And(s.st == GRANTED, z3.Not(s.has_lr)), _ends_by(s, s.granted_at + s.ttl))


def _i6(s: Any, p: Any) -> Any:
    bound = z3.If(s.granted_at + s.ttl >= s.lr + p.E, s.granted_at + s.ttl, s.lr + p.E)
    return z3.Implies(z3.And(s.st == GRANTED, s.has_lr), _ends_by(s, bound))


def _i7(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, _ends_by(s, s.granted_at + z3.If(s.ttl >= p.C, s.ttl, p.C)))


def _i10(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(s.st == ABSENT, s.done == 0),
        z3.Implies(s.st != ABSENT, s.readers >= 1),
        z3.Implies(s.st == GRANTED, s.done < s.readers),
        z3.Implies(s.st == TRANSFERRED, z3.And(s.done >= s.readers, s.done >= 1)),
    )


def _i12(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == EXPIRED, s.deadline <= s.ended_at)


# -- engine (D) ---------------------------------------------------------------------------
def _eng_wf(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(z3.Not(s.tracked), z3.Not(s.has_last)), z3.Implies(s.has_last, s.last <= s.now)
    )


def _i11_state(s: Any, p: Any) -> Any:
    return z3.Implies(z3.And(s.tracked, s.has_last, z3.Not(s.pend)), s.now - s.last < p.H)


def _i11_gap(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    if t.name != "step":
        return z3.BoolVal(True)
    return z3.Implies(z3.And(out["sent"], s.has_last, z3.Not(s.pend)), a.t - s.last < p.H + p.S)


def _i11_turn(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    if t.name != "step":
        return z3.BoolVal(True)
    return z3.And(
        z3.Implies(a.pending, z3.And(s2.last == s.last, s2.has_last == s.has_last)),
        z3.Implies(
            z3.And(z3.Not(a.pending), s.tracked, z3.Or(z3.Not(s.has_last), a.t - s.last >= p.H)),
            out["sent"],
        ),
    )


INVARIANTS: list[Invariant] = [
    *_both("L0", "state", "well-formed lease: fields set by the grant, ghosts in range", _wf),
    Invariant("L0", "lease-cap", "state", "cap_at = granted_at + max_lease_lifetime", _cap_wf),
    *_both("I1", "step", "A renewal never shortens a lease (deadline' >= deadline).", _i1),
    *_both(
        "I2",
        "step",
        "An ended lease never comes back: ended states are absorbing; "
        "no renewal creates or revives a lease.",
        _i2,
    ),
    *_both(
        "I3",
        "state",
        "Every granted lease is released exactly once (one Release per "
        "grant, on GRANTED -> ended).",
        _i3,
    ),
    *_both("I4", "state", "After expire(now), no live lease has deadline <= now.", _i4),
    *_both("I5", "state", "Without renewals a lease ends by granted_at + ttl.", _i5),
    *_both(
        "I6",
        "state",
        "After P's last received heartbeat at h, the lease ends by "
        "max(granted_at + ttl, h + lease_extension).",
        _i6,
    ),
    Invariant(
        "I7",
        "lease-cap",
        "state",
        "With a cap, no lease is held past granted_at + max(ttl, max_lease_lifetime).",
        _i7,
    ),
    *_both(
        "I10",
        "state",
        "A lease is released TRANSFERRED only by a transfer-done that brings the count "
        "to the readers it names (n from the wire; the granted consumers without one): "
        "a live lease has counted fewer than its readers.",
        _i10,
    ),
    *_both(
        "I12",
        "state",
        "P never expires a lease before its deadline on P's clock "
        "(EXPIRED => deadline <= ended_at).",
        _i12,
    ),
    Invariant("L0", "engine", "state", "an untracked engine has no heartbeat timer", _eng_wf),
    Invariant(
        "I11",
        "engine",
        "state",
        "After a step in which it was not pending, a tracked "
        "engine is never overdue (now - last < heartbeat_interval).",
        _i11_state,
    ),
    Invariant(
        "I11",
        "engine",
        "step",
        "Every tracked engine not pending gets a heartbeat "
        "less than heartbeat_interval + step after its previous one.",
        _i11_gap,
    ),
    Invariant(
        "I11",
        "engine",
        "step",
        "A pending engine keeps its turn: a pending step never "
        "consumes it, and the first step not pending sends once due.",
        _i11_turn,
    ),
]
