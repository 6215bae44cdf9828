"""z3 on each obligation: a fixed seed, a per-obligation timeout and a second seed
while z3 answers ``unknown`` (:func:`solve`); :func:`discharge` solves a list and
prints a line each. ``unknown`` is a failure, never a pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from .obligation import Obligation
from .options import TIMEOUT_MS

SEED = 0


#: the last :func:`discharge`'s failed obligations: how many, how many of them crashed and
#: how many z3 could not decide in time (the mutation run tells a failed obligation from a
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
