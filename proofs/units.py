"""``leaseproto prove``'s obligations in units that can be built and discharged apart.

Every obligation of :func:`.check.all_obligations` is in exactly one unit, in the
same order (``tests/test_proofs.py`` checks the partition). The mutation run's
proofs layer (``tools/mutation_layers.py``) runs a mutant only through the units
whose building or solving executes one of its lines, as it does with tests, and
stops at the first unit that fails an obligation by behaviour (not by a crash).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import (
    check,
    code_runs,
    induction,
    model,
    solver,
    table_invariants,
    table_model,
    timing,
    timing_turn2,
)
from . import invariants as inv_mod
from .obligation import Obligation
from .options import TIMEOUT_MS


def _rules() -> list[Obligation]:
    obs = check.concrete_rule_obligations()
    systems = (model.lease_system(cap=False), model.lease_system(cap=True), model.engine_system())
    for sys_ in systems:
        obs += induction.system_obligations(
            sys_, [i for i in inv_mod.INVARIANTS if i.system == sys_.name]
        )
    return obs


def _table() -> list[Obligation]:
    return induction.system_obligations(table_model.table_system(), table_invariants.INVARIANTS)


def _theorems() -> list[Obligation]:
    obs = check.theorem_obligations(model.gate_theorems())
    obs += check.theorem_obligations(timing.theorems())
    obs += check.theorem_obligations(timing_turn2.theorems())
    return obs + check.refutation_obligations(timing_turn2.naive_refutations())


def _timing() -> list[Obligation]:
    obs: list[Obligation] = []
    for sys_, invs in timing.systems():
        obs += induction.system_obligations(sys_, invs)
    return obs + check.witness_obligations()


#: name -> what builds its obligations, in ``all_obligations``' order
UNITS: dict[str, Callable[[], list[Obligation]]] = {
    "rules": _rules,
    "table": _table,
    # each code run (L14-L20) is a unit of its own, named for its system
    **{run.system: run.obligations for run in code_runs.CODE_RUNS},
    "theorems": _theorems,
    "timing": _timing,
}


def run_unit(name: str, out: Any, timeout_ms: int = TIMEOUT_MS) -> tuple[int, int, int]:
    """Build and discharge unit ``name``, printing a line per obligation to ``out``;
    returns (failed, of them crashed, of them undecided by z3 in time). Building that
    raises is one crashed failure."""
    solver.configure()
    try:
        obs = UNITS[name]()
    except Exception as exc:  # the code under proof raised while the unit was built
        print(f"FAIL [{name}] building the unit raised {type(exc).__name__}: {exc}", file=out)
        return 1, 1, 0
    failed = solver.discharge(obs, out, timeout_ms)
    return failed, solver.LAST_RUN["crashed"], solver.LAST_RUN["unknown"]
