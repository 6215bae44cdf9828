"""The assurance tools under tools/ stay in step with the code they mutate."""

from __future__ import annotations

import ast
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def _loops_forever(out: Path) -> None:
    import mutation_layers

    mutation_layers.FLOOR["tests"] = 0.2  # this child's own copy
    limits = mutation_layers.Limits(out, "tests", 30.0, {"a test": 0.0})
    limits.arm("a test")
    while True:
        pass


def _writes(value: int, out: Path) -> None:
    out.write_text(json.dumps({"killed": value % 2 == 1, "value": value}))


def test_a_unit_past_its_limit_kills_the_mutant_and_names_the_unit(tmp_path: Path) -> None:
    import mutation_run

    tasks = iter([("loop", _loops_forever, ())])
    ((tag, res),) = list(mutation_run._jobs_loop(tasks, 1, 60.0, tmp_path))
    assert tag == "loop"
    assert res["killed"] is True
    assert res["first"].startswith("timeout") and "a test" in res["first"], res
    assert res["seconds"] < 20


def test_the_job_loop_waits_for_a_running_task_when_its_source_says_wait(tmp_path: Path) -> None:
    import mutation_run

    done: list[int] = []

    def source() -> Iterator[tuple[Any, ...]]:
        yield 1, _writes, (1,)
        while not done:  # the next task depends on the first one's verdict
            yield mutation_run.WAIT
        yield 2, _writes, (2,)

    results = []
    for tag, res in mutation_run._jobs_loop(source(), 2, 30.0, tmp_path):
        done.append(tag)
        results.append((tag, res["value"], res["killed"]))
    assert results == [(1, 1, True), (2, 2, False)]


def test_a_module_level_mutant_runs_every_test_also_those_that_execute_no_core_line() -> None:
    import mutation_run

    ms = mutants.mutants(1.0, modules=("errors.py",))
    at_import = next(m for m in ms if not m.in_body)
    in_body = next(m for m in ms if m.in_body)
    lines = [f"errors.py:{n}" for n in range(in_body.line, in_body.end_line + 1)]
    base = {
        "tests": {
            "cov": {"<import>": {"errors.py:1"}, "t_runs_it": set(lines), "t_other": set()},
            "took": {"t_runs_it": 2.0, "t_other": 1.0, "t_reads_all": 0.5},
        }
    }
    assert mutation_run._select(at_import, base, "tests") == ["t_reads_all", "t_other", "t_runs_it"]
    assert mutation_run._select(in_body, base, "tests") == ["t_runs_it"]


def test_the_report_reads_a_rerun_of_one_layer_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--layers tests`` writes rows with no checker or proofs entry; ``--report``
    on such a file (the run's own closing report included) counts the missing
    layers as not run. It raised KeyError on them."""
    import mutation_run

    killed, missed = mutants.mutants(1.0, modules=("errors.py",))[:2]
    rows = [
        {"key": killed.key, "where": "w", "what": "x", "tests": {"killed": True, "reached": True}},
        {"key": missed.key, "where": "w", "what": "y", "tests": {"killed": False}},
    ]
    out = tmp_path / "rerun.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mutation_run.report(out)
    text = capsys.readouterr().out
    assert "killed by tests + checker + proofs: 1 of 2" in text
    assert "unit tests alone: 1 (50.0%)" in text and "checker: 0 (0.0%)" in text
    assert f"NOT KILLED\n    {missed.key}" in text


def test_the_report_counts_kills_by_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checker kill by a crash, a misuse or a timeout is not wrong behaviour: the
    report counts each kind apart, and gives checker + proofs by behaviour alone
    (rows written before kinds were recorded are read from their ``first`` line)."""
    import mutation_layers
    import mutation_run

    ms = mutants.mutants(1.0, modules=("errors.py",))[:4]
    checker = [
        {"killed": True, "kind": "behaviour", "first": "small: I4: x"},
        {"killed": True, "first": "small: misuse: LocalProtocolError: y"},  # legacy
        {"killed": True, "first": "KeyError: 'released_expired'"},  # legacy crash
        {"killed": True, "kind": "timeout", "first": "timeout (10 s): small"},
    ]
    rows = [
        {"key": m.key, "where": "w", "what": "x", "tests": {"killed": False}, "checker": c}
        for m, c in zip(ms, checker, strict=True)
    ]
    out = tmp_path / "kinds.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mutation_run.report(out)
    text = capsys.readouterr().out
    assert "checker + proofs alone: 4 (100.0%)" in text
    assert "by wrong behaviour (a violated invariant or a failed obligation): 1 (25.0%)" in text
    assert "checker: 4 (100.0%): 1 behaviour, 1 misuse, 1 crash, 1 timeout" in text
    assert mutation_layers.kind_of("checker", {"killed": False}) is None
    assert mutation_layers.kind_of("proofs", {"killed": True, "first": ""}) == "behaviour"


def test_the_report_gives_the_proofs_share_on_the_data_structures_by_behaviour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 20's item 1: what ``prove`` alone kills by a failed obligation among the
    mutants of the data-structure modules; a crash of the code on z3 terms does not
    count, nor does a mutant of another module."""
    import mutation_run

    table = mutants.mutants(1.0, modules=("table.py",))[:3]
    other = mutants.mutants(1.0, modules=("errors.py",))[:1]
    proofs = [
        {"killed": True, "kind": "behaviour", "first": "x"},
        {"killed": True, "kind": "crash", "first": "y"},
        {"killed": False},
        {"killed": True, "kind": "behaviour", "first": "z"},
    ]
    rows = [
        {"key": m.key, "where": "w", "what": "x", "tests": {"killed": True}, "proofs": p}
        for m, p in zip([*table, *other], proofs, strict=True)
    ]
    out = tmp_path / "data.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mutation_run.report(out)
    text = capsys.readouterr().out
    by = "by wrong behaviour: tests 3, checker 0, proofs 1"  # a test's kill without a kind
    assert f"table.py: 3 run, 3 killed, 0 equivalent; {by}" in text
    assert "renewal.py, tracker.py: 1 of 3 non-equivalent (33.3%)" in text


def test_a_failed_test_is_classed_by_what_it_raised() -> None:
    """The tests layer tells a failed assertion (wrong behaviour) from an exception
    of the mutated code (a crash) and a refused call (misuse)."""
    import builtins

    import hypothesis.errors
    import mutation_layers

    from leaseproto.core.errors import LocalProtocolError

    kind = mutation_layers.failure_kind
    assert kind(AssertionError("x")) == "behaviour"
    with pytest.raises(BaseException) as info:
        pytest.fail("DID NOT RAISE")
    assert kind(info.value) == "behaviour"
    assert kind(hypothesis.errors.Flaky("f")) == "behaviour"
    assert kind(KeyError("released")) == "crash"
    assert kind(TypeError("bad operand")) == "crash"
    assert kind(LocalProtocolError("now went back")) == "misuse"
    group = vars(builtins)["BaseExceptionGroup"]  # Python 3.11
    assert kind(group("two", [KeyError("k"), AssertionError("a")])) == "behaviour"
    assert kind(group("one", [NameError("n")])) == "crash"


def test_the_proofs_layer_runs_units_until_one_fails_by_behaviour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A unit that fails only because the code raised (a crash) or z3 could not decide an
    obligation in time (a timeout) does not end the proofs layer: a later unit can still
    fail by behaviour, which is the kill's kind; a unit whose building raises is one
    crashed failure (proofs/units.py)."""
    import mutation_layers
    import z3
    from leaseproto.proofs import check, units

    def raising() -> list[check.Obligation]:
        raise KeyError("released")

    crash = check.Obligation("s", "raised", (), "unsat", [z3.BoolVal(True)], crashed=True)
    wrong = check.Obligation("s", "refuted", (), "unsat", [z3.BoolVal(True)])
    fine = check.Obligation("s", "holds", (), "unsat", [z3.BoolVal(False)])
    ran: list[str] = []

    def unit(name: str, obs: list[check.Obligation]) -> Any:
        def build() -> list[check.Obligation]:
            ran.append(name)
            return obs

        return build

    monkeypatch.setattr(
        units,
        "UNITS",
        {
            "a": unit("a", [fine]),
            "b": unit("b", [crash]),
            "c": raising,
            "d": unit("d", [fine, wrong]),
            "e": unit("e", [wrong]),
        },
    )
    record: dict[str, Any] = {}
    assert mutation_layers._run_proofs(None, record, None)
    assert ran == ["a", "b", "d"]  # stopped at d, the first failure by behaviour
    assert record["kind"] == "behaviour" and record["first"].startswith("d: [s] refuted")
    assert record["obligations_failed"] == 3 and record["obligations_crashed"] == 2
    record = {}
    assert mutation_layers._run_proofs(["b", "c"], record, None)
    assert record["kind"] == "crash" and record["first"].startswith("b: [s] raised")
    x, y, w = z3.Ints("x y w")  # z3 cannot decide it in time: a timeout, not behaviour
    hard = [x > 0, y > 0, w > 0, x * x * x + y * y * y == w * w * w]
    undecided = check.Obligation("s", "fermat 3", (), "unsat", hard)
    monkeypatch.setitem(units.UNITS, "f", unit("f", [undecided]))
    monkeypatch.setattr(mutation_layers, "PROOF_TIMEOUT_MS", 50)
    record = {}
    assert mutation_layers._run_proofs(["f", "a"], record, None)
    assert record["kind"] == "timeout" and record["obligations_unknown"] == 1
    record = {}
    assert mutation_layers._run_proofs(["f", "e"], record, None)
    assert record["kind"] == "behaviour"
    record = {}
    assert not mutation_layers._run_proofs(["a"], record, None)
    assert "kind" not in record
