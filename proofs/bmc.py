"""Bounded search for schedules: unroll a system from ``init`` along a skeleton.

A skeleton is the order of events, one transition name per step (``"*"``: any
transition, z3's choice); optionally ``(name, constraint(s, a, p))`` narrows a
step. z3 chooses everything else: every time, delay, clock reading and rate,
unpinned parameter and transition argument, subject to the whole model. The
search asks for a run ending in ``goal``; ``unsat`` means no run of that shape
exists. Used for the counterexamples (a schedule breaking an invariant once an
assumption is dropped) and for witnesses that the timing model's normal and
crash behaviours are reachable under the assumptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from .kit import System, Vars

Step = str | tuple[str, Callable[[Any, Any, Any], Any]]


@dataclass
class Run:
    """A search's answer; ``steps`` is ``[(name, pre, args, post)]`` when sat."""

    answer: str
    seconds: float
    model: Any = None
    params: Vars | None = None
    steps: list[tuple[str, Vars, Vars, Vars]] | None = None
    reason: str = ""


def unroll(
    sys_: System,
    skeleton: Sequence[Step],
    goal: Callable[[Any, Any], Any],
    *,
    pins: dict[str, Any] | None = None,
    extra: Callable[[Any], Any] | None = None,
    start: Callable[[Any], Any] | None = None,
) -> tuple[list[Any], Callable[[Any], tuple[Vars, list[Any]]]]:
    """The assertions of a run along ``skeleton`` from an initial state (also
    satisfying ``start``) to ``goal``, parameters pinned to ``pins`` and
    constrained by ``extra``; and a decoder from a model to ``(params, steps)``."""
    p = sys_.param_vars()
    states = [sys_.state(f"k{k}") for k in range(len(skeleton) + 1)]
    names = [t.name for t in sys_.transitions]
    out = [sys_.axioms(p), sys_.init(states[0], p)]
    if start is not None:
        out.append(start(states[0]))
    out += [p[name] == value for name, value in (pins or {}).items()]
    if extra is not None:
        out.append(extra(p))
    picks: list[tuple[Any, dict[str, Vars]]] = []
    for k, step in enumerate(skeleton):
        name, narrow = (step, None) if isinstance(step, str) else step
        pre, post = states[k], states[k + 1]
        pick = z3.Int(f"pick@{k}")
        args_k: dict[str, Vars] = {}
        for i, t in enumerate(sys_.transitions):
            if name not in ("*", t.name):
                continue
            a = sys_.args(t, f"k{k}")
            args_k[t.name] = a
            body = sys_.relation(t, pre, post, a, p)
            if narrow is not None:
                body = z3.And(body, narrow(pre, a, p))
            out.append(z3.Implies(pick == i, body))
        if not args_k:
            raise KeyError(f"{sys_.name} has no transition {name!r}")
        out.append(z3.Or([pick == names.index(n) for n in args_k]))
        picks.append((pick, args_k))
    out.append(goal(states[-1], p))

    def decode(m: Any) -> tuple[Vars, list[Any]]:
        steps = []
        for k, (pick, args_k) in enumerate(picks):
            name = names[m.eval(pick, model_completion=True).as_long()]
            steps.append((name, states[k], args_k[name], states[k + 1]))
        return p, steps

    return out, decode


def search(
    sys_: System,
    skeleton: Sequence[Step],
    goal: Callable[[Any, Any], Any],
    *,
    pins: dict[str, Any] | None = None,
    extra: Callable[[Any], Any] | None = None,
    start: Callable[[Any], Any] | None = None,
    timeout_ms: int = 20_000,
    seed: int = 0,
) -> Run:
    """Solve :func:`unroll`'s assertions; the schedule when there is one."""
    assertions, decode = unroll(sys_, skeleton, goal, pins=pins, extra=extra, start=start)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.set("random_seed", seed)
    s.add(*assertions)
    t0 = time.perf_counter()
    answer = s.check()
    took = time.perf_counter() - t0
    if answer != z3.sat:
        return Run(str(answer), took, reason=s.reason_unknown() if answer == z3.unknown else "")
    m = s.model()
    params, steps = decode(m)
    return Run("sat", took, m, params, steps)
