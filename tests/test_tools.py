"""The assurance tools under tools/ stay in step with the code they mutate."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import mutants  # noqa: E402
import random_profile_power  # noqa: E402

from leaseproto.core.deadlines import DeadlineQueue  # noqa: E402


def test_every_mutant_compiles_and_changes_its_module() -> None:
    ms = mutants.mutants(1.0, modules=("rules.py", "state.py", "clock.py"))
    assert len(ms) > 100
    kinds = {m.what.split()[0] for m in ms}
    assert {"Lt", "Add", "vmax", "or", "not", "constant", "return", "statement"} <= kinds, kinds
    for m in ms:
        original = ast.unparse(ast.parse((mutants.CORE / m.module).read_text()))
        src = mutants.mutated_source(m)
        compile(src, m.module, "exec")
        assert src != original, m.key


def test_mutant_keys_are_unique_and_sampling_is_stable() -> None:
    every = mutants.mutants(1.0)
    assert len({m.key for m in every}) == len(every)
    half = {m.key for m in mutants.mutants(0.5)}
    again = {m.key for m in mutants.mutants(0.5)}
    assert half == again
    for mod in mutants.SAMPLED:  # about half of each sampled module, all of the others
        n = sum(m.module == mod for m in every)
        k = sum(k.startswith(mod + ":") for k in half)
        assert 0.3 * n < k < 0.7 * n, (mod, n, k)
    assert all(m.key in half for m in every if m.module not in mutants.SAMPLED)


def test_the_power_tool_finds_the_expire_fix_it_reverts() -> None:
    src = inspect.getsource(DeadlineQueue.take_due)
    assert src.count(random_profile_power.FIX) == 1
