"""`leaseproto replay`: the spec's scenarios replay to their recorded outcome, their
hand-written `expect` lines hold, and bad scenarios fail cleanly with a line number."""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from leaseproto.cli import main
from leaseproto.scenarios.format import ScenarioError, parse_scenario
from leaseproto.scenarios.replay import replay_text

SCENARIOS = Path(__file__).resolve().parent.parent / "spec" / "scenarios"
SPEC = SCENARIOS.parent / "lease-protocol.md"
FILES = sorted(SCENARIOS.glob("*.jsonl"))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["replay", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_there_are_scenarios_and_the_spec_lists_exactly_them() -> None:
    assert len(FILES) >= 10
    listed = set(re.findall(r"^\| `([\w-]+\.jsonl)` \|", SPEC.read_text(), re.MULTILINE))
    assert listed == {f.name for f in FILES}


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario_replays_to_its_recorded_outcome(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _run(capsys, str(path))
    assert err == ""
    assert status == 0
    assert out == path.with_suffix(".out").read_text(), (
        f"replay output changed; if intended: leaseproto replay {path} > {path.with_suffix('.out')}"
    )


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario_expectations_hold_and_exist(path: Path) -> None:
    result = replay_text(path.read_text())
    assert result.error is None
    assert result.expects_failed == 0
    assert result.expects_ok >= 1  # a scenario without checks would prove nothing


# -- what the scenarios show, read from the events (not from the golden files) ------------------
def _releases(name: str) -> dict[tuple[str, str], tuple[str, float]]:
    result = replay_text((SCENARIOS / name).read_text())
    return {
        (e.where, e.data["id"]): (e.data["reason"], e.t)
        for e in result.events
        if e.kind == "release"
    }


def test_b1_schedules_reclaim_the_dead_tail_on_time_I4() -> None:
    rel = _releases("b1-reaper-order.jsonl")
    assert rel[("P", "B")] == ("expired", 31.0)
    assert rel[("P", "Y")] == ("expired", 31.0)
    assert ("P", "A") not in rel and ("P", "X") not in rel


def test_surge_expires_nothing_D_still_tracks_I8() -> None:
    rel = _releases("surge.jsonl")
    assert {reason for reason, _ in rel.values()} == {"transferred"}
    assert len(rel) == 4


def test_cap_ends_a_heartbeating_lease_at_granted_at_plus_cap_I7() -> None:
    assert _releases("cap.jsonl")[("P", "A")] == ("expired", 60.0)


def test_d_crash_reclaim_within_bound_I5_I6() -> None:
    rel = _releases("d-crash.jsonl")
    # max(granted_at + L, last handled heartbeat + E), released at the next P step (0.25 s)
    for rid, bound in (
        ("A", max(0 + 30, 20.75 + 20)),
        ("B", max(12 + 30, 20.75 + 20)),
        ("C", 22 + 30),
    ):
        reason, at = rel[("P", rid)]
        assert reason == "expired"
        assert bound <= at <= bound + 0.25


def test_heterogeneous_tp_needs_consumers_notifications_I10() -> None:
    result = replay_text((SCENARIOS / "heterogeneous-tp.jsonl").read_text())
    counted = [e for e in result.events if e.where == "P0" and e.kind == "transfer_done"]
    release = [e for e in result.events if e.where == "P0" and e.kind == "release"]
    assert len(release) == 1 and release[0].t == 10.75
    assert "counted 1 of 2" in counted[0].text


def test_late_messages_never_revive_and_late_transfer_is_nacked_I2() -> None:
    result = replay_text((SCENARIOS / "late-transfer-nack.jsonl").read_text())
    nacks = [e.data["nack"] for e in result.events if e.kind == "late_transfer"]
    assert nacks == ["NK:expired:A", "NK:expired:C"]
    grants = [e for e in result.events if e.kind == "grant"]
    releases = [e for e in result.events if e.kind == "release"]
    assert len(releases) == len(grants)  # each lease released exactly once (I3)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_every_expiry_is_at_or_after_the_deadline_and_once_per_grant_I12_I3(path: Path) -> None:
    result = replay_text(path.read_text())
    expired = [e for e in result.events if e.kind == "release" and e.data["reason"] == "expired"]
    for e in expired:  # `at` and `deadline` are both on P's clock
        assert e.data["deadline"] <= e.data["at"], e
    grants = [(e.where, e.data["id"]) for e in result.events if e.kind == "grant"]
    releases = [(e.where, e.data["id"]) for e in result.events if e.kind == "release"]
    assert len(releases) == len(set(releases))  # no lease released twice
    assert set(releases) <= set(grants)


def test_pending_handshake_keeps_the_turn_I11() -> None:
    result = replay_text((SCENARIOS / "first-heartbeat-handshake.jsonl").read_text())
    sent = [e.t for e in result.events if e.kind == "heartbeat" and e.where == "D"]
    assert sent[:2] == [2.5, 7.5]


def test_a_broken_renewal_loop_fails_the_scenarios(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replays drive the real loops: make the renewal assign instead of taking the
    max (breaking I1) and the hand-written expectations catch it."""
    from leaseproto.core import renewal

    src = inspect.getsource(renewal.renew_ids)
    old = "held.deadline = deadline if deadline >= target else target"
    assert src.count(old) == 1
    ns: dict[str, Any] = {}
    exec(textwrap.dedent(src).replace(old, "held.deadline = target"), vars(renewal), ns)
    monkeypatch.setattr(renewal, "renew_ids", ns["renew_ids"])
    result = replay_text((SCENARIOS / "normal.jsonl").read_text())
    assert result.expects_failed >= 1
    assert any("EXPECT FAILED" in e.text and "deadline of cmpl-1" in e.text for e in result.events)


# -- clocks --------------------------------------------------------------------------------
def test_a_fast_P_clock_expires_early_in_real_time() -> None:
    text = "\n".join(
        [
            '{"clocks": {"P": {"rate": 1.25}}}',
            '{"t": 0, "op": "grant", "id": "A"}',
            '{"t": 0.5, "op": "p_step", "every": 0.5, "until": 30}',
            '{"t": 24, "op": "expect", "released": {"A": {"reason": "expired", "at": 30}}}',
        ]
    )
    result = replay_text(text)
    assert result.ok
    rel = [e for e in result.events if e.kind == "release"]
    assert rel[0].t == 24.0  # P's clock reads 30 at real time 24


# -- output forms --------------------------------------------------------------------------
def test_json_output_is_one_object_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--json", str(SCENARIOS / "abort.jsonl"))
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all({"t", "where", "kind", "text", "line"} <= set(r) for r in rows)
    nacks = [r for r in rows if r["kind"] == "late_transfer"]
    assert nacks[0]["nack"] == "NK:aborted:A"


def test_failed_expect_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text('{"t": 0, "op": "grant", "id": "A"}\n{"t": 1, "op": "expect", "live": []}\n')
    status, out, _ = _run(capsys, str(f))
    assert status == 1
    assert "EXPECT FAILED (live): live on P is ['A'], expected []" in out


# -- bad scenarios -------------------------------------------------------------------------
BAD = [
    ('{"t": 0, "op": "grant", "id": "A"}\n{"t": 0, "op": "grant" "id": "B"}', 2, "not valid JSON"),
    ('{"t": 0, "op": "graant", "id": "A"}', 1, "unknown op 'graant'"),
    ('{"t": 0, "op": "grant", "id": "A", "ttl_s": 3}', 1, "unknown field(s) ['ttl_s']"),
    ('{"t": 0, "op": "grant"}', 1, "missing field 'id'"),
    ('{"t": 2, "op": "p_step"}\n\n{"t": 1, "op": "p_step"}', 3, "lines must be in time order"),
    ('{"t": -1, "op": "p_step"}', 1, "'t' must be a finite number >= 0"),
    ('{"t": 0, "op": "grant", "id": "A", "consumers": 0}', 1, "'consumers' must be >= 1"),
    ('{"config": {"heartbeat_interval": 25}}\n{"t": 0, "op": "p_step"}', 1, "rule C2"),
    ('{"config": {"kv_lease_durration": 25}}', 1, "unknown config key(s)"),
    ('{"t": 0, "op": "p_step"}\n{"delay": 1}', 2, "header"),
    ('{"t": 0, "op": "track", "id": "a", "engine": "Q"}', 1, "unknown engine 'Q'"),
    (
        '{"engines": {"P": {"tp": 2}}}\n{"t": 0, "op": "grant", "id": "A", "rank": 2}',
        2,
        "rank 2 out of range",
    ),
    (
        '{"engines": {"P": {}, "Q": {}}}\n{"t": 0, "op": "grant", "id": "A"}',
        2,
        "'engine' is required",
    ),
    ('{"t": 0, "op": "send", "abort": "A", "transfer_done": "A"}', 1, "exactly one of"),
    ('{"t": 0, "op": "p_step", "every": 1}', 1, "'every' needs 'until'"),
    ('{"t": 0, "op": "expect"}', 1, "nothing to check"),
    ('{"t": 0, "op": "expect", "released": {"A": "gone"}}', 1, "needs a reason"),
    ("[1, 2]", 1, "must be a JSON object"),
    ("# only a comment", 0, "no operations"),
    ('{"grantor": "Q"}', 1, "'grantor' must be"),
    # a mirrored world writes the reader's crash p_crash: d_crash would be the grantor's
    ('{"grantor": "D"}\n{"t": 0, "op": "d_crash"}', 2, "unknown op 'd_crash'; known: grant"),
    ('{"t": 1, "op": "gate", "id": "A", "sampled_at": 0.5, "rtt": 1}', 1, "ends after 't'"),
    ('{"t": 1, "op": "gate", "id": "A", "rho": 1}', 1, "'rho' must be below 1"),
    ('{"t": 1, "op": "use", "id": "A"}', 1, "missing field 'verify'"),
    ('{"t": 1, "op": "expect", "uses": {"A": ["fine"]}}', 1, "must be a list of used, stale"),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_bad_scenario_names_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text)
    assert info.value.line == line
    assert message in str(info.value)


RUNTIME_BAD = [
    (
        '{"t": 0, "op": "grant", "id": "A"}\n{"t": 1, "op": "grant", "id": "A"}',
        2,
        "cannot be granted again",
    ),
    (
        '{"t": 0, "op": "track", "id": "a"}\n{"t": 1, "op": "track", "id": "a"}',
        2,
        "already tracked",
    ),
    ('{"t": 0, "op": "d_crash"}\n{"t": 1, "op": "track", "id": "a"}', 2, "D is down"),
    ('{"t": 0, "op": "d_restart"}', 1, "D is running"),
    ('{"t": 0, "op": "send", "abort": "a,b"}', 1, "contains ','"),
    ('{"t": 0, "op": "expect", "p_stats": {"nope": 1}}', 1, "unknown p_stats counter"),
    ('{"t": 0, "op": "expect", "where": "Z", "live": []}', 1, "names no engine or rank"),
    ('{"t": 0, "op": "gate", "id": "A"}', 1, "gate: P never granted 'A'"),
    (
        '{"t": 0, "op": "grant", "id": "A"}\n{"t": 1, "op": "use", "id": "A", "verify": true}',
        2,
        "use: 'A' was never read",
    ),
    (
        '{"grantor": "D"}\n{"t": 0, "op": "p_crash"}\n{"t": 1, "op": "track", "id": "a"}',
        3,
        "P is down (crashed at line 2); add a p_restart line first",
    ),
    (
        '{"grantor": "D"}\n{"t": 0, "op": "expect", "d_stats": {"heartbeats": 1}}',
        2,
        "unknown d_stats counter",
    ),
]


@pytest.mark.parametrize(("text", "line", "message"), RUNTIME_BAD)
def test_misuse_stops_the_replay_at_its_line(
    text: str, line: int, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text(text)
    status, _, err = _run(capsys, str(f))
    assert status == 2
    assert f"line {line}: " in err and message in err
    assert "Traceback" not in err


def test_parse_errors_reach_the_cli_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "s.jsonl"
    f.write_text('{"t": 0, "op": "grant", "id": "A"}\n{"t": 1, "op": "nope"}\n')
    status, out, err = _run(capsys, str(f))
    assert (status, out) == (2, "")
    assert "line 2: unknown op 'nope'" in err and "Traceback" not in err
    status, _, err = _run(capsys, str(tmp_path / "missing.jsonl"))
    assert status == 2 and "cannot read" in err


# -- the mirrored world: D grants, P reads (spec §2.8) -----------------------------------------
def test_turn2_gate_admits_then_a_late_read_is_stale_gate_only_and_recomputed_verified_I14() -> (
    None
):
    result = replay_text((SCENARIOS / "turn2-gate-only.jsonl").read_text())
    ev = result.events
    gates = {e.data["id"]: e.data["admits"] for e in ev if e.kind == "gate"}
    assert gates == {"X": True, "Y": True}  # the real ClockOffset gate admits both reads
    assert all(e.where == "P" for e in ev if e.kind in ("gate", "use", "track", "untrack"))
    freed = {e.data["id"]: e.t for e in ev if e.kind == "release"}
    done = next(e.t for e in ev if e.kind == "send" and e.data["payload"] == "X:1")
    assert freed["X"] < freed["Y"] < done  # D freed both before the READs completed
    assert {e.data["id"]: e.data["outcome"] for e in ev if e.kind == "use"} == {
        "X": "stale",  # gate-only: used anyway, from blocks D may have reused
        "Y": "recomputed",  # verified: D's NK, the prefix is recomputed
    }
    assert [e.data["verdict"] for e in ev if e.kind == "late_transfer"] == [
        "NK:expired:X",
        "NK:expired:Y",
    ]


def test_a_mirrored_world_runs_the_same_engine_with_the_sides_renamed() -> None:
    """normal.jsonl with the roles swapped: the same decisions, printed for D
    granting and P reading, with the letters of the ops swapped."""
    normal = (SCENARIOS / "normal.jsonl").read_text()
    swap = {"p_step": "d_step", "d_step": "p_step", "p_stats": "d_stats", "d_stats": "p_stats"}
    lines = []
    for raw in normal.splitlines():
        if not raw.startswith("{"):
            continue
        obj = json.loads(raw)
        if "op" in obj:
            obj = {swap.get(k, k): v for k, v in obj.items()}
            obj["op"] = swap.get(obj["op"], obj["op"])
        else:
            obj["grantor"] = "D"
        lines.append(json.dumps(obj))
    plain, mirrored = replay_text(normal), replay_text("\n".join(lines))
    assert mirrored.ok and plain.ok and mirrored.expects_ok == plain.expects_ok
    swap_side = {"P": "D", "D": "P", "-": "-"}
    assert [(e.t, e.kind) for e in mirrored.events] == [(e.t, e.kind) for e in plain.events]
    assert [e.where for e in mirrored.events] == [swap_side[e.where] for e in plain.events]


def test_a_verified_use_waits_for_the_verdict_and_uses_an_ok() -> None:
    text = """{"grantor": "D", "delay": 0.1}
{"t": 0, "op": "grant", "id": "X"}
{"t": 1, "op": "send", "transfer_done": "X"}
{"t": 1, "op": "use", "id": "X", "verify": true}
{"t": 1.2, "op": "d_step"}
{"t": 1.3, "op": "use", "id": "X", "verify": true}
{"t": 1.3, "op": "use", "id": "X", "verify": false}
{"t": 1.3, "op": "expect", "uses": {"X": ["waiting", "used", "used"]}}
{"t": 1.3, "op": "expect", "d_stats": {"released_transferred": 1}}
"""
    result = replay_text(text)
    assert result.ok, [e.text for e in result.events]
