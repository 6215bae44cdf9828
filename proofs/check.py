"""Discharge every proof obligation with z3 and print one line each.

For each system (mypyvy's ``check_init`` / ``check_transitions``):

* ``init sat``: the axioms and initial states are satisfiable;
* ``init => Ik``: every initial state satisfies each state invariant;
* ``T enabled``: some state satisfying all invariants takes transition ``T``
  to its interesting outcome (so no inductive step passes vacuously);
* ``Ik preserved by T``: all state invariants before, plus ``T``, imply ``Ik``
  after (``Ik`` a state invariant) or the step property ``Ik`` (a step one).

Each theorem (I9's gate, the timing bounds of :mod:`proofs.timing`) is proven
valid and its hypotheses shown satisfiable. A fixed seed and a per-obligation
timeout make runs repeatable; ``unknown`` is a failure, never a pass.
Models are rebuilt on every run, so a rule patched in memory is what gets proven.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import z3

from leaseproto.core import rules as R
from leaseproto.core.state import Input, LeaseState

from . import (
    bmc,
    model,
    table_invariants,
    table_model,
    timing,
    timing_turn2,
)
from . import counterexamples as cx
from . import invariants as inv_mod
from .code_runs import CODE_RUNS
from .induction import render, system_obligations
from .obligation import Obligation
from .options import SYSTEMS, TIMEOUT_MS, add_arguments
from .solver import configure, discharge


def theorem_obligations(theorems: Sequence[model.Theorem]) -> list[Obligation]:
    obs = []
    for th in theorems:

        def show(m: Any, th: Any = th) -> list[str]:
            return ["values: " + render(m, th.show.items())]

        obs.append(
            Obligation(
                th.system,
                f"{th.id} {th.name}: hypotheses sat",
                (th.id,),
                "sat",
                [th.hyps],
                why=f"{th.id}: hypotheses are unsatisfiable",
            )
        )
        obs.append(
            Obligation(
                th.system,
                f"{th.id} {th.name}",
                (th.id,),
                "unsat",
                [th.hyps, z3.Not(th.goal)],
                show,
                why=f"theorem {th.id} is false: {th.text}",
            )
        )
    return obs


def refutation_obligations(theorems: Sequence[model.Theorem]) -> list[Obligation]:
    """A naive variant is refuted: z3 must find values meeting its hypotheses where
    its goal fails (expected SAT, as the counterexamples of §11.13)."""
    obs = []
    for th in theorems:

        def show(m: Any, th: Any = th) -> list[str]:
            return ["counterexample: " + render(m, th.show.items())]

        obs.append(
            Obligation(
                th.system,
                f"{th.id} {th.name} refuted",
                (th.id,),
                "sat",
                [th.hyps, z3.Not(th.goal)],
                show,
                why=f"naive variant not refuted: {th.text}",
            )
        )
    return obs


def concrete_rule_obligations() -> list[Obligation]:
    """The runtime's branch of ``next_state`` (a table lookup on ``int``) and the
    symbolic one the models use agree on every (state, input, guard): what is proven
    over the ``ite`` chain is what the runtime executes. A pair the lookup rejects
    must be ``NO_ROW`` symbolically."""
    obs = []
    x, b = z3.Int("st"), z3.Bool("guard")
    for inp in Input:
        cases = []
        for st in LeaseState:
            for guard in (True, False):
                try:
                    want = R.next_state(int(st), inp, guard)
                except KeyError:
                    want = R.NO_ROW
                cases.append(z3.And(x == int(st), b == guard, R.next_state(x, inp, b) != int(want)))
        obs.append(
            Obligation(
                "lease",
                f"L0 next_state(st, {inp.value}) symbolic = concrete lookup",
                ("L0",),
                "unsat",
                [z3.Or(*cases)],
                lambda m: ["values: " + render(m, [("st", x), ("guard", b)])],
                why=f"the runtime's lookup and the proofs' ite chain differ on {inp.value}",
            )
        )
    return obs


def all_obligations(system: str | None = None, *, only: str | None = None) -> list[Obligation]:
    """Every obligation (of ``system`` only, if given), with the models built now
    from the current rules. ``only``: an invariant or lemma id; the code runs
    (:data:`.code_runs.CODE_RUNS`, most of the building time) whose obligations do
    not name it are not built, since :func:`select` keeps none of them for it."""
    obs: list[Obligation] = []
    if system is None or not system.startswith("timing"):
        obs += concrete_rule_obligations()
        for sys_ in (
            model.lease_system(cap=False),
            model.lease_system(cap=True),
            model.engine_system(),
        ):
            obs += system_obligations(
                sys_, [i for i in inv_mod.INVARIANTS if i.system == sys_.name]
            )
        if system in (None, "table"):
            obs += system_obligations(table_model.table_system(), table_invariants.INVARIANTS)
        for code_run in CODE_RUNS:
            if system in (None, code_run.system) and (not only or only in code_run.ids):
                obs += code_run.obligations()
        obs += theorem_obligations(model.gate_theorems())
        obs += theorem_obligations(timing.theorems())
        obs += theorem_obligations(timing_turn2.theorems())
        obs += refutation_obligations(timing_turn2.naive_refutations())
    if system is None or system.startswith("timing"):
        for sys_, invs in timing.systems():
            obs += system_obligations(sys_, invs)
        obs += witness_obligations()
    return obs


def witness_obligations() -> list[Obligation]:
    """The timing model's good behaviours are reachable under T1 and T2 (a run of
    normal operation past the initial ttl; a crash reclaimed by expiry)."""
    obs = []
    for case in cx.cases():
        if case.expect_bad:
            continue
        sys_ = cx.case_system(case)
        assertions, _ = bmc.unroll(
            sys_,
            case.skeleton,
            case.goal,
            pins=case.pins,
            extra=case.extra,
            start=cx.case_start(case),
        )
        obs.append(
            Obligation(
                sys_.name,
                f"reachable: {case.name.removeprefix('witness: ')} ({len(case.skeleton)} steps)",
                ("I8", "I6"),
                "sat",
                assertions,
                why=f"no run of the composed model shows {case.claim}",
            )
        )
    return obs


def select(obs: list[Obligation], only: str | None, system: str | None = None) -> list[Obligation]:
    """The obligations of invariant ``only``: in each system that has it, its own,
    the supporting lemmas (``L...``) its proof relies on, and the sat checks.
    ``system`` keeps one system's obligations."""
    if system:
        obs = [o for o in obs if o.system == system]
    if not only:
        return obs
    systems = {o.system for o in obs if only in o.ids}

    def wanted(o: Obligation) -> bool:
        return not o.ids or only in o.ids or all(i.startswith("L") for i in o.ids)

    return [o for o in obs if o.system in systems and wanted(o)]


def run(
    only: str | None = None,
    *,
    timeout_ms: int = TIMEOUT_MS,
    out: Any = None,
    counterexamples: bool = False,
    system: str | None = None,
    scenarios: str | None = None,
) -> int:
    """Check everything (or what ``only`` names); print a line per obligation.
    Returns the exit status: 0 when every obligation is ok."""
    out = out or sys.stdout
    configure()
    start = time.perf_counter()
    obs = select(all_obligations(system, only=only), only, system)
    if not obs:
        asked = " ".join(f"--{k} {v}" for k, v in (("only", only), ("system", system)) if v)
        print(
            f"leaseproto prove: no obligation matches {asked} (systems: {SYSTEMS})",
            file=sys.stderr,
        )
        return 2
    failed = discharge(obs, out, timeout_ms)
    total = time.perf_counter() - start
    status = 0
    if failed:
        print(f"FAILED: {failed} of {len(obs)} obligations ({total:.1f} s)", file=out)
        status = 1
    else:
        print(f"all ok: {len(obs)} obligations ({total:.1f} s)", file=out)
    if counterexamples:
        status |= cx.run(out=out, timeout_ms=timeout_ms, scenarios=scenarios)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m leaseproto.proofs", description=__doc__.split("\n")[0]
    )
    add_arguments(ap)
    args = ap.parse_args(argv)
    return run(
        only=args.only,
        timeout_ms=args.timeout_ms,
        counterexamples=args.counterexamples,
        system=args.system,
        scenarios=args.scenarios,
    )
