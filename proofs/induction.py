"""The obligations of a transition system (mypyvy's ``check_init`` /
``check_transitions``; the list is :mod:`.check`'s docstring), and how a model's
values are shown in a failed one's lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import z3

from . import model
from .kit import System, fmt, model_value
from .obligation import Obligation


# -- rendering ----------------------------------------------------------------------------
def render(m: Any, values: Iterable[tuple[str, Any]]) -> str:
    parts = []
    for name, expr in values:
        v = model_value(m, expr)
        if name == "st" and isinstance(v, int):
            v = model.STATE_NAMES.get(v, v)
        parts.append(f"{name}={fmt(v)}")
    return " ".join(parts)


def _changed(m: Any, s: Any, s2: Any) -> list[tuple[str, Any]]:
    return [(n, s2[n]) for n in s.names() if model_value(m, s[n]) != model_value(m, s2[n])]


# -- obligations --------------------------------------------------------------------------
def system_obligations(sys_: System, invs: Sequence[Any]) -> list[Obligation]:
    p = sys_.param_vars()
    s, s2 = sys_.state("0"), sys_.state("1")
    ax = sys_.axioms(p)
    state_invs = [i for i in invs if i.kind == "state"]
    step_invs = [i for i in invs if i.kind == "step"]
    names = _part_names(state_invs) + _part_names(step_invs)
    all_pre = [i.pred(s, p) for i in state_invs]
    n = sys_.name

    def params_line(m: Any) -> str:
        return "params: " + render(m, p.items())

    def show_initial(m: Any) -> list[str]:
        return ["initial state: " + render(m, s.items()), params_line(m)]

    obs = [
        Obligation(
            n,
            "init sat",
            (),
            "sat",
            [ax, sys_.init(s, p)],
            why="the axioms and initial states are unsatisfiable",
        )
    ]
    for k, i in enumerate(state_invs):
        obs.append(
            Obligation(
                n,
                f"init => {names[k]}",
                (i.id,),
                "unsat",
                [ax, sys_.init(s, p), z3.Not(i.pred(s, p))],
                show_initial,
                why=f"an initial state violates {i.id}: {i.text}",
            )
        )
    for t in sys_.transitions:
        a = sys_.args(t, "0")
        rel = sys_.relation(t, s, s2, a, p)
        out = t.outputs(s, a, p) if t.outputs else {}
        wit = t.witness(s, s2, a, p) if t.witness else z3.BoolVal(True)
        obs.append(
            Obligation(
                n,
                f"{t.name} enabled",
                (),
                "sat",
                [ax, *all_pre, rel, wit],
                why=f"transition {t.name} never reaches its witness from a "
                "state satisfying the invariants: proofs would be vacuous",
            )
        )

        def cti(m: Any, a: Any = a, t: Any = t) -> list[str]:
            return [
                "before: " + render(m, s.items()),
                f"{t.name}({render(m, a.items())})",
                "after:  " + (render(m, _changed(m, s, s2)) or "(nothing changed)"),
                params_line(m),
            ]

        for k, i in enumerate(state_invs):
            obs.append(
                Obligation(
                    n,
                    f"{names[k]} preserved by {t.name}",
                    (i.id,),
                    "unsat",
                    [ax, *all_pre, rel, z3.Not(i.pred(s2, p))],
                    cti,
                    why=f"invariant {i.id} is not preserved by transition {t.name}: {i.text}",
                )
            )
        for k, i in enumerate(step_invs, start=len(state_invs)):
            obs.append(
                Obligation(
                    n,
                    f"{names[k]} holds across {t.name}",
                    (i.id,),
                    "unsat",
                    [ax, *all_pre, rel, z3.Not(i.pred(s, s2, a, p, t=t, out=out))],
                    cti,
                    why=f"step property {i.id} fails on transition {t.name}: {i.text}",
                )
            )
    return obs


def _part_names(invs: Sequence[Any]) -> list[str]:
    """Each invariant's name in labels: its id, or ``I6.1``, ``I6.2``... when one id
    has several parts of one kind in a system, so no two obligations share a label."""
    counts: dict[str, int] = {}
    for i in invs:
        counts[i.id] = counts.get(i.id, 0) + 1
    seen: dict[str, int] = {}
    names = []
    for i in invs:
        seen[i.id] = seen.get(i.id, 0) + 1
        names.append(i.id if counts[i.id] == 1 else f"{i.id}.{seen[i.id]}")
    return names
