"""Every schedule ``leaseproto prove --counterexamples`` prints is replayed on the
real code through ``leaseproto replay``: each counterexample reproduces its
violation (P releases a lease EXPIRED while D tracks it), each naive variant's
schedule does not (the real code is not naive), each witness behaves as it
says. A model whose schedule the real code does not reproduce fails."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import z3
from leaseproto.proofs import bmc, counterexamples, cx_cases, cx_replay
from leaseproto.proofs.timing_state import Options

from leaseproto import ClockOffset, LeaseTable, cli


def replay_cli(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """``leaseproto replay --json FILE``'s events."""
    assert cli.main(["replay", "--json", str(path)]) == 0
    return [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]


def test_every_printed_schedule_replays_on_the_real_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    buf = io.StringIO()
    assert counterexamples.run(out=buf, scenarios=tmp_path) == 0, buf.getvalue()
    out = buf.getvalue()
    cases = counterexamples.cases()
    # the BMC cases and the turn-2 gate-only read (proofs/cx_turn2.py)
    assert out.count("ok   on the real code (leaseproto replay)") == len(cases) + 1, out
    assert "FAIL" not in out
    events = replay_cli(tmp_path / "turn2-gate-only.jsonl", capsys)
    assert [e["admits"] for e in events if e["kind"] == "gate"] == [True]
    freed = [e for e in events if e["kind"] == "release"]
    assert [e["reason"] for e in freed] == ["expired"] and freed[0]["where"] == "D"
    done = next(e["t"] for e in events if e["kind"] == "send")
    assert freed[0]["t"] < done  # D freed the blocks before P's READ completed
    assert [e["outcome"] for e in events if e["kind"] == "use"] == ["stale", "recomputed"]
    for case in cases:
        events = replay_cli(tmp_path / f"{counterexamples._slug(case.name)}.jsonl", capsys)
        releases = [e for e in events if e["kind"] == "release"]
        crashed = any(e["kind"] == "crash" for e in events)
        if case.system is not None:  # the naive reaper: the real expire frees B
            assert any(e["id"] == "b" and e["reason"] == "expired" for e in releases), case.name
        elif case.name.startswith("naive"):
            assert not releases, (case.name, releases)
        elif case.expect_bad:  # I8's violation, on the real code
            assert [e["reason"] for e in releases] == ["expired"], case.name
            assert not crashed, case.name
            end = next(e for e in events if e["kind"] == "end" and e["where"] == "D")
            assert cx_replay.RID in end["tracked"], case.name
        elif "crash" in case.name:
            assert crashed and [e["reason"] for e in releases] == ["expired"]
        else:
            assert not releases, case.name


def test_a_model_without_arrival_events_prints_a_schedule_the_code_does_not_have() -> None:
    """The model before arrival events let P step on with a heartbeat that had
    arrived; its 'overlong P step' schedule (P stepping throughout, a heartbeat
    left unhandled past its delay bound) renews the lease on the real code."""

    def busy(s: Any, a: Any, p: Any) -> Any:  # P steps throughout: no overlong step
        return z3.And(cx_cases.steady(s, a, p), a.p_busy)

    beat: list[Any] = [("advance", busy), ("advance", busy), "d_step"]
    case = cx_cases.Case(
        "SP exceeded (no arrival events)",
        "the old model's schedule",
        Options(actual=frozenset({"SP"}), arrivals=False),
        cx_cases._pins(),
        ["grant", "track", "d_step", *beat * 6, ("advance", cx_cases.steady), "p_step"],
        cx_cases._premature,
        cx_cases.pin_rates(lambda p: p.SP_act > p.SP, {}),
    )
    run = bmc.search(
        cx_cases.case_system(case),
        case.skeleton,
        case.goal,
        pins=case.pins,
        extra=case.extra,
        start=cx_cases.case_start(case),
    )
    assert run.answer == "sat"
    ok, text = cx_replay.verdict(case, cx_replay.replay(case, run))
    assert not ok and "NOT reproduced" in text, text


def test_a_runtime_that_drops_heartbeats_fails_the_normal_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check can fail: the model is intact (z3 finds the witness), the real
    code, broken in memory, does not keep the lease alive."""
    monkeypatch.setattr(LeaseTable, "renew", lambda self, ids, *, now, lost=None: 0)
    buf = io.StringIO()
    assert counterexamples.run(out=buf, names=["witness: normal operation"]) == 1
    assert "FAIL on the real code (leaseproto replay): the real code releases it" in buf.getvalue()


def test_a_gate_that_refuses_what_the_model_admits_fails_the_turn2_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The turn-2 schedule is checked against the real gate: a ClockOffset whose
    gate differs from the model's (here: refuses everything) fails it."""
    monkeypatch.setattr(ClockOffset, "read_allowed", lambda self, d, *, now, margin=5.0: False)
    buf = io.StringIO()
    assert counterexamples.run(out=buf, names=["turn2 gate-only"]) == 1
    assert "FAIL on the real code (leaseproto replay): the real gate refuses" in buf.getvalue()
