"""z3 models of the protocol, built by calling the core's own rules.

Every state change below is computed by a function of :mod:`leaseproto.core.rules`
(``next_state`` over :data:`leaseproto.core.state.TRANSITIONS`, ``grant_deadline``,
``renew_deadline``, ``expire_state``, ``heartbeat_due``, ``read_allowed``...)
applied to z3 terms. The rules are looked up on the module *when a model is
built*, never bound at import, so a test that patches a rule in memory
(``monkeypatch.setattr(leaseproto.core.rules, "renew_deadline", ...)``) and rebuilds
the model proves the patched rule. What is written here by hand is only the
bookkeeping the runtime does around the rules (which fields a call touches, the
time it passes), and ghost variables the invariants talk about; the refinement
test (``tests/test_refinement.py``) checks that bookkeeping against
:class:`~leaseproto.LeaseTable` and :class:`~leaseproto.HeartbeatTracker`.

Systems
-------
``lease`` / ``lease-cap``
    One lease on P, on P's clock (``now``), without and with a lifetime cap.
    Transitions: ``grant``, ``renew`` (a heartbeat naming the lease),
    ``transfer_done``, ``abort``, ``expire`` (the reaper ran), ``advance`` (any
    other call: time passes). Ghosts: ``grants``, ``released`` (how many
    ``Release`` s the runtime returned), ``swept`` (``now`` of the last
    ``expire``), ``ended_at``, ``lr``/``has_lr`` (last renewal).
``engine``
    One P engine on D's heartbeat schedule, on D's clock: ``step`` (a call to
    ``due`` with the engine pending or not), ``track``, ``untrack_last``.
``gate`` (theorems, no transitions)
    The bidirectional read gate with one handshake sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from leaseproto.core import rules as R  # rules are read from the module at build time
from leaseproto.core import state as _state
from leaseproto.core.state import Input

from .kit import Bool, Int, Real, System, Transition

ABSENT = int(_state.LeaseState.ABSENT)
GRANTED = int(_state.LeaseState.GRANTED)
TRANSFERRED = int(_state.LeaseState.TRANSFERRED)
EXPIRED = int(_state.LeaseState.EXPIRED)
ABORTED = int(_state.LeaseState.ABORTED)
STATE_NAMES = {int(s): s.name for s in _state.LeaseState}


def ended(st: Any) -> Any:
    """``st`` is one of the absorbing ended states (from the state table's data)."""
    return z3.Or([st == int(x) for x in sorted(_state.ENDED_STATES)])


def allowed(st: Any, inp: Input) -> Any:
    """``(st, inp)`` has a row in :data:`TRANSITIONS` (a missing pair is local misuse)."""
    return z3.Or([st == int(src) for (src, i) in _state.TRANSITIONS if i is inp])


def release_fired(st: Any, st2: Any) -> Any:
    """The runtime returns a ``Release`` exactly when a granted lease leaves GRANTED."""
    return z3.And(st == GRANTED, st2 != GRANTED)


# -- one lease on P -----------------------------------------------------------------------
LEASE_FIELDS = {
    "st": Int,
    "now": Real,
    "granted_at": Real,
    "ttl": Real,
    "deadline": Real,
    "cap_at": Real,
    "consumers": Int,
    "readers": Int,
    "done": Int,
    "lr": Real,
    "has_lr": Bool,
    "grants": Int,
    "released": Int,
    "swept": Real,
    "ended_at": Real,
}


def lease_system(cap: bool) -> System:
    """One lease on P; ``cap`` adds ``max_lease_lifetime`` (param ``C``)."""
    params = {"E": Real, "C": Real} if cap else {"E": Real}

    def axioms(p: Any) -> Any:
        return z3.And(p.E > 0, p.C > 0) if cap else p.E > 0

    def init(s: Any, p: Any) -> Any:
        return z3.And(
            s.st == ABSENT,
            s.done == 0,
            s.grants == 0,
            s.released == 0,
            z3.Not(s.has_lr),
            s.swept <= s.now,
        )

    def timed(s: Any, t: Any, st2: Any) -> dict[str, Any]:
        rel = release_fired(s.st, st2)
        return {
            "now": t,
            "st": st2,
            "released": s.released + z3.If(rel, 1, 0),
            "ended_at": z3.If(rel, t, s.ended_at),
        }

    def later(s: Any, a: Any, p: Any) -> Any:
        return a.t >= s.now

    def grant_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        st2 = R.next_state(s.st, Input.GRANT, True)
        u = timed(s, a.t, st2)
        u.update(
            granted_at=a.t,
            ttl=a.ttl,
            deadline=R.grant_deadline(a.t, a.ttl),
            consumers=a.consumers,
            readers=a.consumers,
            done=0,
            has_lr=False,
            grants=s.grants + 1,
        )
        if cap:
            u["cap_at"] = a.t + p.C
        return u

    def renew_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        applies = R.renew_applies(s.st, s.deadline, a.t)
        u = timed(s, a.t, R.next_state(s.st, Input.RECV_HEARTBEAT, applies))
        u.update(
            deadline=R.renew_deadline(s.st, s.deadline, s.cap_at if cap else None, a.t, p.E),
            lr=z3.If(applies, a.t, s.lr),
            has_lr=z3.Or(s.has_lr, applies),
        )
        return u

    def transfer_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        # n: the notification's readers (the granted consumers when it carries none)
        u = timed(s, a.t, R.transfer_done_state(s.st, s.done, a.n))
        u["done"] = R.transfer_done_count(s.st, s.done)
        u["readers"] = z3.If(s.st == GRANTED, a.n, s.readers)
        return u

    def expire_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        u = timed(s, a.t, R.expire_state(s.st, s.deadline, a.t))
        u["swept"] = a.t
        return u

    def rel_out(s: Any, a: Any, p: Any, upd: Any) -> dict[str, Any]:
        return {"release": release_fired(s.st, upd(s, a, p)["st"])}

    t_only = {"t": Real}
    transitions = [
        Transition(
            "grant",
            "prefill finished: grant(req, now=t, ttl, consumers)",
            {"t": Real, "ttl": Real, "consumers": Int},
            lambda s, a, p: z3.And(
                later(s, a, p), allowed(s.st, Input.GRANT), a.ttl > 0, a.consumers >= 1
            ),
            grant_upd,
            witness=lambda s, s2, a, p: z3.And(s.st == ABSENT, s2.st == GRANTED),
        ),
        Transition(
            "renew",
            "a heartbeat naming the lease: renew([req], now=t)",
            t_only,
            later,
            renew_upd,
            witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.deadline > s.deadline),
        ),
        Transition(
            "transfer_done",
            "one transfer-done notification: transfer_done(req, now=t, readers=n)",
            {"t": Real, "n": Int},
            lambda s, a, p: z3.And(later(s, a, p), a.n >= 1),
            transfer_upd,
            witness=lambda s, s2, a, p: z3.And(
                s.st == GRANTED, s2.st == TRANSFERRED, a.n > 1, s.consumers != a.n
            ),
            outputs=lambda s, a, p: rel_out(s, a, p, transfer_upd),
        ),
        Transition(
            "abort",
            "D's abort: abort(req, now=t)",
            t_only,
            later,
            lambda s, a, p: timed(s, a.t, R.abort_state(s.st)),
            witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.st == ABORTED),
        ),
        Transition(
            "expire",
            "the reaper: expire(now=t)",
            t_only,
            later,
            expire_upd,
            witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.st == EXPIRED),
        ),
        Transition(
            "advance",
            "any call on another lease: time passes",
            t_only,
            later,
            lambda s, a, p: {"now": a.t},
            witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.now > s.now),
        ),
    ]
    name = "lease-cap" if cap else "lease"
    text = (
        "one lease on P with max_lease_lifetime" if cap else "one lease on P without a lifetime cap"
    )
    return System(name, text, dict(LEASE_FIELDS), params, axioms, init, transitions)


# -- one engine on D ----------------------------------------------------------------------
ENGINE_FIELDS = {"now": Real, "tracked": Bool, "has_last": Bool, "last": Real, "pend": Bool}


def engine_sent(s: Any, a: Any, p: Any) -> Any:
    """``HeartbeatTracker.due`` returns the engine: tracked, not pending, and never
    sent or ``heartbeat_due`` on its last heartbeat."""
    return z3.And(
        s.tracked, z3.Not(a.pending), z3.Or(z3.Not(s.has_last), R.heartbeat_due(s.last, a.t, p.H))
    )


def engine_system() -> System:
    """One P engine in D's ``HeartbeatTracker``, stepped at most ``S`` apart."""

    def step_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        sent = engine_sent(s, a, p)
        return {
            "now": a.t,
            "last": z3.If(sent, a.t, s.last),
            "has_last": z3.Or(s.has_last, sent),
            "pend": a.pending,
        }

    transitions = [
        Transition(
            "step",
            "D's step: due(now=t, pending=...) with this engine pending or not",
            {"t": Real, "pending": Bool},
            lambda s, a, p: z3.And(a.t >= s.now, a.t - s.now <= p.S),
            step_upd,
            witness=lambda s, s2, a, p: z3.And(s.has_last, s2.last == a.t, s.last < a.t),
            outputs=lambda s, a, p: {"sent": engine_sent(s, a, p)},
        ),
        Transition(
            "track",
            "track(req, engine_id=this engine): one more request on it",
            {},
            lambda s, a, p: z3.BoolVal(True),
            lambda s, a, p: {"tracked": True},
            witness=lambda s, s2, a, p: z3.Not(s.tracked),
        ),
        Transition(
            "untrack_last",
            "untrack of its last request, or drop_engine",
            {},
            lambda s, a, p: s.tracked,
            lambda s, a, p: {"tracked": False, "has_last": False},
            witness=lambda s, s2, a, p: s.has_last,
        ),
    ]
    return System(
        "engine",
        "one P engine on D's heartbeat schedule (D's clock)",
        dict(ENGINE_FIELDS),
        {"H": Real, "S": Real},
        lambda p: z3.And(p.H > 0, p.S > 0),
        lambda s, p: z3.And(z3.Not(s.tracked), z3.Not(s.has_last), z3.Not(s.pend)),
        transitions,
    )


# -- theorems (no transitions) ------------------------------------------------------------
@dataclass
class Theorem:
    """``hyps`` ⇒ ``goal`` for all values of the free constants; ``hyps`` must be
    satisfiable (checked too, so the theorem is not vacuous)."""

    id: str
    system: str
    name: str
    text: str
    hyps: Any
    goal: Any
    show: dict[str, Any]


def sample_offset(t0: Any, remote_time: Any, t1: Any) -> tuple[Any, Any]:
    """What ``ClockOffset.add_sample`` keeps for one sample: ``(offset, uncertainty)``
    (the refinement test checks ClockOffset against this)."""
    return remote_time - (t0 + t1) / 2, (t1 - t0) / 2


def gate_theorems() -> list[Theorem]:
    """I9 without drift: a read the gate admits happens, on the peer's clock,
    at least ``margin`` before the peer's deadline."""
    t0, t1, b, theta, now, d, margin = z3.Reals("t0 t1 b theta now remote_deadline margin")
    remote_time = b + theta  # the peer read its clock at our local time b in [t0, t1]
    offset, unc = sample_offset(t0, remote_time, t1)
    hyps = z3.And(t0 <= b, b <= t1, margin >= 0, R.read_allowed(d, now, offset, unc, margin))
    show = {
        "t0": t0,
        "t1": t1,
        "peer_read_at": b,
        "true_offset": theta,
        "now": now,
        "remote_deadline": d,
        "margin": margin,
    }
    return [
        Theorem(
            "I9",
            "gate",
            "sample bounds the offset",
            "a handshake sample's offset is within its uncertainty of the true offset",
            z3.And(t0 <= b, b <= t1),
            z3.And(offset - unc <= theta, theta <= offset + unc),
            show,
        ),
        Theorem(
            "I9",
            "gate",
            "admitted read is before the peer's deadline",
            "read_allowed(d, now, offset, unc, margin) => now + true_offset + margin < d",
            hyps,
            now + theta + margin < d,
            show,
        ),
    ]
