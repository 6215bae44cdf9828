"""The insertion-order reaper (upstream B1) refuted: two leases on one P clock and
a reaper that walks them in grant order, stopping at the first one not due.
A case of :mod:`proofs.counterexamples`."""

from __future__ import annotations

from typing import Any

import z3

from leaseproto.core import rules as R

from .bmc import Run
from .cx_cases import Case, num
from .kit import System, Transition, Values, model_value
from .model import GRANTED, STATE_NAMES, lease_system
from .timing_state import Options


def reaper_system() -> System:
    """Two leases A (granted first) and B on one P clock; ``expire_naive`` walks them
    in grant order and stops at the first one not due."""
    one = lease_system(cap=False)
    fields = {f"{x}_{f}": sort for x in "ab" for f, sort in one.fields.items()}

    def view(s: Any, x: str) -> Values:
        return Values({f: s[f"{x}_{f}"] for f in one.fields})

    def lift(tname: str, x: str, also_now: bool = True) -> Any:
        t = one.transition(tname)

        def upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
            u = {f"{x}_{k}": v for k, v in t.update(view(s, x), a, p).items()}
            other = "b" if x == "a" else "a"
            if also_now:
                u[f"{other}_now"] = a.t
            return u

        return Transition(
            f"{t.name}_{x}",
            f"{t.text} for lease {x.upper()}",
            t.args,
            lambda s, a, p: t.guard(view(s, x), a, p),
            upd,
        )

    def naive_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        due_a = R.expire_due(s.a_st, s.a_deadline, a.t)
        st_a = R.expire_state(s.a_st, s.a_deadline, a.t)
        st_b = z3.If(
            z3.Or(due_a, s.a_st != GRANTED),  # stop at the first live entry not due
            R.expire_state(s.b_st, s.b_deadline, a.t),
            s.b_st,
        )
        return {
            "a_st": st_a,
            "b_st": st_b,
            "a_now": a.t,
            "b_now": a.t,
            "a_swept": a.t,
            "b_swept": a.t,
        }

    ts = [
        lift("grant", "a"),
        lift("grant", "b"),
        lift("renew", "a"),
        lift("renew", "b"),
        Transition(
            "expire_naive",
            "insertion-order reaper",
            {"t": z3.RealSort()},
            lambda s, a, p: z3.And(a.t >= s.a_now, a.t >= s.b_now),
            naive_upd,
        ),
    ]
    return System(
        "reaper-naive",
        "two leases, insertion-order reaper",
        fields,
        one.params,
        one.axioms,
        lambda s, p: z3.And(
            one.init(view(s, "a"), p), one.init(view(s, "b"), p), s.a_now == s.b_now
        ),
        ts,
    )


def reaper_case() -> Case:
    def goal(s: Any, p: Any) -> Any:
        return z3.And(
            s.b_st == GRANTED,
            z3.Not(s.b_has_lr),
            s.b_swept == s.b_now,
            s.b_deadline + 10 <= s.b_swept,
            s.a_st == GRANTED,
        )

    def ttl30(s: Any, a: Any, p: Any) -> Any:
        return a.ttl == 30

    def later(s: Any, a: Any, p: Any) -> Any:
        return z3.And(a.ttl == 30, a.t > s.a_granted_at)

    def never_absent(m: Any, p: Any, run: Run) -> str:
        assert run.steps is not None
        _, pre, a, _ = run.steps[-1]
        st = R.expire_state(pre.b_st, pre.b_deadline, a.t)
        return (
            f"leaseproto's expire(now) checks every due lease: on this state it "
            f"releases B ({STATE_NAMES[model_value(m, st)]}) (I4, I5 proven in system lease)"
        )

    return Case(
        "naive: insertion-order reaper",
        "a reaper that stops at the first "
        "unexpired entry in grant order strands B, whose decoder is gone, behind "
        "A, which keeps being renewed (upstream B1; breaks I4 and I5)",
        Options(),
        {"E": 20},
        [("grant_a", ttl30), ("grant_b", later), "renew_a", "expire_naive"],
        goal,
        system=reaper_system(),
        notes=[never_absent],
    )


def narrate_reaper(m: Any, name: str, s: Any, a: Any, s2: Any) -> str:
    def f(e: Any) -> str:
        return num(m, e)

    if name.startswith("grant_"):
        x = name[-1]
        return f"grant {x.upper()} with ttl {f(a.ttl)}: deadline {f(s2[f'{x}_deadline'])}"
    if name.startswith("renew_"):
        x = name[-1]
        return (
            f"heartbeat for {x.upper()}: deadline {f(s[f'{x}_deadline'])} -> "
            f"{f(s2[f'{x}_deadline'])}"
        )
    st = {x: STATE_NAMES[model_value(m, s2[f"{x}_st"])] for x in "ab"}
    return (
        f"naive expire: A (deadline {f(s['a_deadline'])}) is first and not due, so "
        f"the walk stops: A {st['a']}, B {st['b']} with deadline {f(s['b_deadline'])}"
        f" <= now - 10"
    )
