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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from leaseproto.core import rules as R
from leaseproto.core.state import Input, LeaseState

from . import (
    bmc,
    clock_gate,
    codec,
    giveup_rule,
    loops,
    model,
    settings,
    structures,
    table_invariants,
    table_model,
    timing,
    timing_turn2,
    tracking,
)
from . import counterexamples as cx
from . import invariants as inv_mod
from .code_runs import (
    clock_obligations,
    giveup_obligations,
    loop_obligations,
    settings_obligations,
    structure_obligations,
    tracker_obligations,
    wire_obligations,
)
from .kit import System, fmt, model_value
from .obligation import Obligation
from .options import SYSTEMS, TIMEOUT_MS, add_arguments

SEED = 0


#: the last :func:`run`'s failed obligations: how many, how many of them crashed and how
#: many z3 could not decide in time (the mutation run tells a failed obligation from a
#: crash and from a timeout by them)
LAST_RUN: dict[str, int] = {"failed": 0, "crashed": 0, "unknown": 0}


@dataclass
class Result:
    obligation: Obligation
    ok: bool
    answer: str
    seconds: float
    detail: list[str]


def configure() -> None:
    z3.set_param("smt.random_seed", SEED)
    z3.set_param("sat.random_seed", SEED)
    z3.set_param("nlsat.seed", SEED)


#: seeds a solve tries in turn while z3 answers ``unknown``: z3's search, and so its time,
#: can change with the shape of the terms (a dict's order, the hash seed, the context's
#: earlier terms), and an obligation that takes 50 ms once took 20 s under another shape;
#: any seed's ``unsat`` is a proof, and ``unknown`` from every seed still counts as FAIL
RETRY_SEEDS = (SEED, SEED + 1)


def solve(ob: Obligation, timeout_ms: int = TIMEOUT_MS) -> Result:
    start = time.perf_counter()
    unknown: list[str] = []
    for seed in RETRY_SEEDS:
        s = z3.Solver()
        s.set("timeout", timeout_ms)
        s.set("random_seed", seed)
        s.add(*ob.assertions)
        answer = s.check()
        if answer != z3.unknown:
            break
        unknown.append(f"{s.reason_unknown()} with seed {seed}")
    took = time.perf_counter() - start
    if answer == z3.unknown:
        return Result(
            ob,
            False,
            "unknown",
            took,
            [f"z3 answered unknown ({'; '.join(unknown)}): counted as FAIL"],
        )
    got = "sat" if answer == z3.sat else "unsat"
    if got == ob.expect:
        return Result(ob, True, got, took, [])
    if got == "sat":  # a counterexample to a proof obligation
        return Result(ob, False, got, took, [ob.why, *ob.show(s.model())])
    return Result(ob, False, got, took, [ob.why or "no witness exists: the check is vacuous"])


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


def all_obligations(system: str | None = None) -> list[Obligation]:
    """Every obligation (of ``system`` only, if given), with the models built now
    from the current rules."""
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
        if system in (None, loops.SYSTEM):
            obs += loop_obligations()
        if system in (None, structures.SYSTEM):
            obs += structure_obligations()
        if system in (None, tracking.SYSTEM):
            obs += tracker_obligations()
        if system in (None, codec.SYSTEM):
            obs += wire_obligations()
        if system in (None, settings.SYSTEM):
            obs += settings_obligations()
        if system in (None, clock_gate.SYSTEM):
            obs += clock_obligations()
        if system in (None, giveup_rule.SYSTEM):
            obs += giveup_obligations()
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


def discharge(obs: Sequence[Obligation], out: Any, timeout_ms: int = TIMEOUT_MS) -> int:
    """Solve each obligation and print its line (and why, when it fails); returns how
    many failed."""
    failed = crashed = unknown = 0
    for ob in obs:
        r = solve(ob, timeout_ms)
        tag = "ok  " if r.ok else "FAIL"
        crashed += not r.ok and ob.crashed
        unknown += not r.ok and not ob.crashed and r.answer == "unknown"
        print(f"{tag} [{ob.system}] {ob.label}  ({r.seconds * 1000:.0f} ms)", file=out)
        if not r.ok:
            failed += 1
            for line in r.detail:
                print(f"       {line}", file=out)
    LAST_RUN.update(failed=failed, crashed=crashed, unknown=unknown)
    return failed


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
    obs = select(all_obligations(system), only, system)
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
