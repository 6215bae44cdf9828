"""Trace validation (``leaseproto check-trace``, spec §9.1): a legal run of one
prefill and one decode rank passes, and each hand-made defect in it -- a
renewal no heartbeat explains, a release before the deadline, an OK for an
expired lease, a read used before its OK, a heartbeat nobody sent -- fails
naming its invariant. A real run's traces are in tests/test_e2e_trace.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from leaseproto import LeaseConfig
from leaseproto.checker.trace import TraceError, check_files, load
from leaseproto.cli import main

P, D = "prefill-engine-r0-aaaaaa", "decode-r0-bbbbbb"
CONFIG = LeaseConfig(3.0, heartbeat_interval=1.0).as_dict()  # D heartbeats every 1 s


def _header(role: str, agent: str) -> dict[str, Any]:
    return {
        "ev": "header",
        "t": 99.0,
        "v": 1,
        "role": role,
        "engine": "e",
        "rank": 0,
        "tp": 1,
        "agent": agent,
        "pid": 1,
        "host": "h",
        "boot": "boot-1",
        "config": CONFIG,
        "policy": "lease",
        "verify_reads": True,
    }


def _hb(*ids: str) -> str:
    return "HB:" + ",".join(ids)


def legal() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Lease a: granted at 100, renewed at 100.5 (to 103) and 101.5 (to 103.5),
    transferred at 102 and answered OK, used by D. Lease b: never heartbeated,
    expired at 103 (its deadline)."""
    p = [
        _header("prefill", P),
        {
            "ev": "grant",
            "t": 100.0,
            "now": 100.0,
            "req": "a",
            "consumers": 1,
            "blocks": 2,
            "lease": 3.0,
        },
        {
            "ev": "grant",
            "t": 100.0,
            "now": 100.0,
            "req": "b",
            "consumers": 1,
            "blocks": 2,
            "lease": 3.0,
        },
        {"ev": "recv", "t": 100.5, "src": D, "data": _hb("a")},
        {"ev": "recv", "t": 100.5, "src": D, "data": "HB:leaseproto/1"},
        {"ev": "handle", "t": 100.5, "now": 100.5, "src": D, "data": _hb("a")},
        {"ev": "renew", "t": 100.5, "now": 100.5, "leases": {"a": 2.5}},
        {"ev": "handle", "t": 100.5, "now": 100.5, "src": D, "data": "HB:leaseproto/1"},
        {"ev": "send", "t": 100.5, "to": D, "data": "OK:leaseproto/1", "ok": True},
        {"ev": "expire", "t": 100.6, "now": 100.6, "n": 0},
        {"ev": "recv", "t": 101.5, "src": D, "data": _hb("a")},
        {"ev": "handle", "t": 101.5, "now": 101.5, "src": D, "data": _hb("a")},
        {"ev": "renew", "t": 101.5, "now": 101.5, "leases": {"a": 2.0}},
        {"ev": "recv", "t": 102.0, "src": D, "data": "a:1"},
        {"ev": "handle", "t": 102.0, "now": 102.0, "src": D, "data": "a:1"},
        {
            "ev": "release",
            "t": 102.0,
            "req": "a",
            "reason": "transferred",
            "at": 102.0,
            "granted_at": 100.0,
            "deadline": 103.5,
            "last_renewal": 101.5,
            "blocks": 2,
        },
        {"ev": "send", "t": 102.0, "to": D, "data": "OK:a", "ok": True},
        {"ev": "expire", "t": 103.0, "now": 103.0, "n": 1},
        {
            "ev": "release",
            "t": 103.0,
            "req": "b",
            "reason": "expired",
            "at": 103.0,
            "granted_at": 100.0,
            "deadline": 103.0,
            "last_renewal": None,
            "blocks": 2,
        },
        {"ev": "end", "t": 104.0},
    ]
    d = [
        _header("decode", D),
        {"ev": "send", "t": 100.4, "to": P, "data": _hb("a"), "ok": True},
        {"ev": "send", "t": 100.4, "to": P, "data": "HB:leaseproto/1", "ok": True},
        {"ev": "recv", "t": 100.6, "src": P, "data": "OK:leaseproto/1"},
        {"ev": "send", "t": 101.4, "to": P, "data": _hb("a"), "ok": True},
        {"ev": "read", "t": 101.9, "to": P, "data": "a:1"},
        {"ev": "recv", "t": 102.1, "src": P, "data": "OK:a"},
        {"ev": "use", "t": 102.2, "req": "a", "remote": "a", "ok_from": [P]},
        {"ev": "end", "t": 104.0},
    ]
    return p, d


def _write(tmp_path: Path, p: list[dict[str, Any]], d: list[dict[str, Any]]) -> list[Path]:
    out = []
    for name, events in (("prefill-0", p), ("decode-0", d)):
        path = tmp_path / f"{name}.trace.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        out.append(path)
    return out


def _find(events: list[dict[str, Any]], **match: Any) -> int:
    return next(i for i, e in enumerate(events) if all(e.get(k) == v for k, v in match.items()))


def test_a_legal_run_passes(tmp_path: Path) -> None:
    report = check_files(_write(tmp_path, *legal()))
    assert report.ok, [str(v) for v in report.violations]
    assert (report.files, report.leases, report.releases, report.uses) == (2, 2, 2, 1)
    assert report.matched == 6 and report.external == 0
    assert main(["check-trace", *map(str, _write(tmp_path, *legal()))]) == 0


def _renewal_without_heartbeat(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    # after the transfer-done, P logs that it moved b's deadline
    i = _find(p, ev="send", data="OK:a")
    p.insert(i + 1, {"ev": "renew", "t": 102.0, "now": 102.0, "leases": {"b": 2.0}})


def _release_before_deadline(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    i = _find(p, ev="expire", n=1)
    p[i]["now"] = p[i + 1]["at"] = 102.5


def _ok_for_expired(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    # D reads b after it expired; P answers OK (NK:expired is the only legal answer)
    d[-1:-1] = [
        {"ev": "read", "t": 103.1, "to": P, "data": "b:1"},
        {"ev": "recv", "t": 103.3, "src": P, "data": "OK:b"},
        {"ev": "use", "t": 103.4, "req": "b", "remote": "b", "ok_from": [P]},
    ]
    p[-1:-1] = [
        {"ev": "recv", "t": 103.2, "src": D, "data": "b:1"},
        {"ev": "handle", "t": 103.2, "now": 103.2, "src": D, "data": "b:1"},
        {"ev": "send", "t": 103.2, "to": D, "data": "OK:b", "ok": True},
    ]


def _use_before_ok(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    use = d.pop(_find(d, ev="use"))
    d.insert(_find(d, ev="recv", data="OK:a"), use)


def _heartbeat_nobody_sent(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    del d[_find(d, ev="send", t=101.4)]


MUTANTS = {
    "renewal no heartbeat explains": (_renewal_without_heartbeat, "I6"),
    "release before the deadline": (_release_before_deadline, "I12"),
    "OK for an expired lease": (_ok_for_expired, "I13"),
    "D uses a read before OK": (_use_before_ok, "I13"),
    "heartbeat received that nobody sent": (_heartbeat_nobody_sent, "§3.1"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_defect_fails_naming_its_invariant(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate, invariant = MUTANTS[name]
    p, d = copy.deepcopy(legal())
    mutate(p, d)
    files = _write(tmp_path, p, d)
    report = check_files(files)
    first = report.first()
    assert first is not None, f"{name}: not caught"
    assert first.invariant == invariant, [str(v) for v in report.violations]
    assert main(["check-trace", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert f"VIOLATION {first.event.path}:{first.event.line}: {invariant}:" in out


def test_a_trace_cut_by_sigkill_may_lack_its_last_outputs(tmp_path: Path) -> None:
    p, d = legal()
    cut = p[: _find(p, ev="expire", n=1) + 1]  # killed before it logged b's release
    files = _write(tmp_path, cut, d)
    files[0].write_text(files[0].read_text() + '{"ev": "recv", "t": 10')  # a half-written line
    report = check_files(files)
    assert report.ok and report.cut == 1, [str(v) for v in report.violations]
    # ... but a clean trace that lacks it fails (the table released b, P never did)
    files = _write(tmp_path, [*cut, {"ev": "end", "t": 104.0}], d)
    assert check_files(files).first() is not None
    assert check_files(files).violations[0].invariant == "I4"


def test_untraced_senders_are_counted_not_invented(tmp_path: Path) -> None:
    p, d = legal()
    i = _find(p, ev="expire", n=1)
    p[i:i] = [
        {"ev": "recv", "t": 102.5, "src": "injector-1", "data": "HB:nope"},
        {"ev": "handle", "t": 102.5, "now": 102.5, "src": "injector-1", "data": "HB:nope"},
        {"ev": "renew", "t": 102.5, "now": 102.5, "leases": {}},
    ]
    report = check_files(_write(tmp_path, p, d))
    assert report.ok and report.external == 1, [str(v) for v in report.violations]


def test_not_a_trace_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "x.log"
    f.write_text("2026-12-01 17:53:26,123 leaseproto.prefill INFO granted\n")
    with pytest.raises(TraceError, match="not JSON"):
        load(f)
    assert main(["check-trace", str(f)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_the_writer_writes_what_the_checker_reads(tmp_path: Path) -> None:
    from leaseproto.checker.trace_events import _release_of
    from leaseproto.core.events import Release, ReleaseReason
    from leaseproto.workers.trace import NO_TRACE, TraceWriter, open_trace

    assert (
        open_trace(None, role="prefill", engine="e", rank=0, tp=1, agent=P, config=LeaseConfig(3.0))
        is NO_TRACE
    )
    path = tmp_path / "p.trace.jsonl"
    w = open_trace(
        path,
        role="prefill",
        engine="e",
        rank=0,
        tp=1,
        agent=P,
        config=LeaseConfig(3.0),
        policy="lease",
    )
    assert isinstance(w, TraceWriter)
    rel = Release(
        "a", ReleaseReason.EXPIRED, 103.0, granted_at=100.0, deadline=103.0, last_renewal=None
    )
    w.expire(101.0, 0)
    w.expire(102.0, 0)  # only the last idle expire before the next event is written
    w.emit("send", stamp=5.0, to=D, data="OK:a", ok=True)
    w.expire(103.0, 1)
    w.release(rel, 2)
    w.close()
    tf = load(path)
    assert tf.complete and tf.agent == P and tf.header["config"] == LeaseConfig(3.0).as_dict()
    kinds = [(e.ev, e.obj.get("now")) for e in tf.events]
    assert kinds == [
        ("expire", 102.0),
        ("send", None),
        ("expire", 103.0),
        ("release", None),
        ("end", None),
    ]
    assert tf.events[1].t == 5.0
    assert _release_of(tf.events[3].obj) == rel


def test_a_malformed_event_is_a_violation_naming_its_line(tmp_path: Path) -> None:
    p, d = legal()
    i = _find(p, ev="release", req="a")
    del p[i]["at"]
    report = check_files(_write(tmp_path, p, d))
    bad = [v for v in report.violations if v.invariant == "format"]
    assert bad and bad[0].event.line == i + 1, [str(v) for v in report.violations]
    assert "malformed 'release' event" in bad[0].message


def test_a_line_that_is_not_an_event_is_a_violation_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _write(tmp_path, *legal())
    lines = files[0].read_text().splitlines(keepends=True)
    lines.insert(3, "garbage {\n")
    lines.insert(5, "[1, 2]\n")
    files[0].write_text("".join(lines))
    report = check_files(files)
    got = sorted((v.event.line, v.invariant) for v in report.violations)
    assert got == [(4, "format"), (6, "format")], [str(v) for v in report.violations]
    assert main(["check-trace", "--all", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert f"{files[0]}:4: format: not JSON" in out and "Traceback" not in out


def test_data_that_is_not_bytes_is_a_violation_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace writes bytes as latin-1 characters; a ``data`` outside them (or not a
    string) is a malformed line naming itself, never a UnicodeEncodeError."""
    p, d = legal()
    i = _find(p, ev="send")
    j = _find(d, ev="recv")
    p[i]["data"] = "OK:a\u20ac"  # no byte is that character
    d[j]["data"] = ["HB:a"]
    files = _write(tmp_path, p, d)
    report = check_files(files)
    bad = sorted((v.event.path, v.event.line) for v in report.violations if v.invariant == "format")
    assert bad == sorted([(str(files[0]), i + 1), (str(files[1]), j + 1)]), [
        str(v) for v in report.violations
    ]
    assert main(["check-trace", "--all", *map(str, files)]) == 1
    out = capsys.readouterr().out
    assert f"{files[0]}:{i + 1}: format: data is not a string of bytes" in out
    assert "Traceback" not in out


def test_now_going_back_is_a_violation_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p, d = legal()
    i = _find(p, ev="expire", now=100.6)
    p[i]["now"] = 100.2  # after the handle at 100.5
    files = _write(tmp_path, p, d)
    first = check_files(files).first()
    assert first is not None and first.invariant == "§10", first
    assert first.event.line == i + 1 and "went back from 100.5 to 100.2" in first.message
    assert main(["check-trace", *map(str, files)]) == 1
    assert f"{files[0]}:{i + 1}: §10:" in capsys.readouterr().out


def test_a_reap_before_handling_what_was_received_breaks_A1(tmp_path: Path) -> None:
    """P polled D's heartbeat at 101.5 but reaped before handling it."""
    p, d = legal()
    i = _find(p, ev="recv", t=101.5)
    p.insert(i + 1, {"ev": "expire", "t": 101.5, "now": 101.5, "n": 0})
    report = check_files(_write(tmp_path, p, d))
    first = report.first()
    assert first is not None and first.invariant == "A1", [str(v) for v in report.violations]
    assert first.event.line == i + 2 and "was not handled" in first.message
    assert report.violations == [first]  # the rest of the run is legal


def test_a_first_notification_held_by_the_sender_gate_is_no_A1_breach(tmp_path: Path) -> None:
    p, d = legal()
    i = _find(p, ev="recv", t=100.5)  # D's first: P has handled nothing from it yet
    p.insert(i + 1, {"ev": "expire", "t": 100.5, "now": 100.5, "n": 0})
    report = check_files(_write(tmp_path, p, d))
    assert report.ok, [str(v) for v in report.violations]


def test_a_forgotten_senders_notification_held_by_the_gate_is_no_A1_breach(
    tmp_path: Path,
) -> None:
    """P forgot D (its metadata removed, spec §10.2) after handling D's first
    notification: D's next one waits in the sender gate as a stranger's would,
    and P may reap meanwhile (the real run that showed it: tests/test_e2e_bound's
    forgetting test). Without the ``forget`` event the same trace breaks A1."""
    p, d = legal()
    i = _find(p, ev="recv", t=101.5)
    p.insert(i + 1, {"ev": "expire", "t": 101.5, "now": 101.5, "n": 0})
    p.insert(i, {"ev": "forget", "t": 101.4, "now": 101.4, "agents": [D]})
    report = check_files(_write(tmp_path, p, d))
    assert report.ok, [str(v) for v in report.violations]
    del p[i]
    report = check_files(_write(tmp_path, p, d))
    first = report.first()
    assert first is not None and first.invariant == "A1", [str(v) for v in report.violations]


def _staged_then_granted() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """D's transfer-done (n = 1) reaches P before its grant to 2 consumers: the
    spec releases the lease at the grant (the staged ``n`` decides); this P
    logged no release, as a table that ignores the staged ``n`` does."""
    p, d = legal()
    i = _find(p, ev="grant", req="b")
    p[i:i] = [
        {"ev": "recv", "t": 100.0, "src": D, "data": "c:1"},
        {"ev": "handle", "t": 100.0, "now": 100.0, "src": D, "data": "c:1"},
        {"ev": "send", "t": 100.0, "to": D, "data": "NK:unknown:c", "ok": True},
        {
            "ev": "grant",
            "t": 100.0,
            "now": 100.0,
            "req": "c",
            "consumers": 2,
            "blocks": 2,
            "lease": 3.0,
        },
    ]
    d.insert(1, {"ev": "read", "t": 99.9, "to": P, "data": "c:1"})
    d.insert(2, {"ev": "recv", "t": 100.1, "src": P, "data": "NK:unknown:c"})
    return p, d


def test_p_is_checked_against_the_naive_model_not_its_own_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of LeaseTable (the staged ``n`` ignored at grant) in the worker is not in
    its validator: with the same bug in this process, check-trace still finds it."""
    from test_checker import mutate

    from leaseproto.core.table import LeaseTable

    mutate(
        monkeypatch,
        LeaseTable,
        "grant",
        "readers = int(staged[3]) or lease.consumers",
        "readers = lease.consumers",
    )
    p, d = _staged_then_granted()
    report = check_files(_write(tmp_path, p, d))
    assert not report.ok
    assert any(
        v.invariant == "I10" and "never released c" in v.message for v in report.violations
    ), [str(v) for v in report.violations]


def test_a_read_of_an_ended_lease_used_unverified_fails(tmp_path: Path) -> None:
    # D reads b after it expired and uses it without a verdict (as against a P
    # that gives none): I13 holds only if it never uses such a read
    p, d = legal()
    d[-1:-1] = [
        {"ev": "read", "t": 103.1, "to": P, "data": "b:1"},
        {"ev": "use", "t": 103.4, "req": "b", "remote": "b", "ok_from": []},
    ]
    p[-1:-1] = [
        {"ev": "recv", "t": 103.2, "src": D, "data": "b:1"},
        {"ev": "handle", "t": 103.2, "now": 103.2, "src": D, "data": "b:1"},
        {"ev": "send", "t": 103.2, "to": D, "data": "NK:expired:b", "ok": True},
    ]
    first = check_files(_write(tmp_path, p, d)).first()
    assert first is not None and first.invariant == "I13"
    assert (
        "had ended when P handled its transfer-done" in first.message and "EXPIRED" in first.message
    )


def test_the_timing_of_a_legal_run_is_measured(tmp_path: Path) -> None:
    report = check_files(_write(tmp_path, *legal()))
    t = report.timing
    assert (t.intervals, t.longest, t.tracked_expiries, t.findings) == (1, 1.0, 0, [])
    assert t.delay == pytest.approx(0.1)  # D's heartbeats sent at x.4, handled at x.5
    assert "timing: 1 heartbeat intervals" in report.summary()


def _late_heartbeat(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
    """D's next heartbeat naming a comes 1.6 s after the last (H = 1 s)."""
    d.insert(_find(d, ev="read"), {"ev": "send", "t": 103.0, "to": P, "data": _hb("a"), "ok": True})


def _expired_while_heartbeated(gap_from: float) -> Any:
    """D heartbeats b (lost on the way) from ``gap_from`` on and after its expiry at 103."""

    def edit(p: list[dict[str, Any]], d: list[dict[str, Any]]) -> None:
        d[-1:-1] = [
            {"ev": "send", "t": gap_from, "to": P, "data": _hb("b"), "ok": True},
            {"ev": "send", "t": 103.2, "to": P, "data": _hb("b"), "ok": True},
        ]
        d.sort(key=lambda e: (e["ev"] != "header", e["ev"] == "end", e["t"]))

    return edit


@pytest.mark.parametrize(
    ("edit", "inv"),
    [(_late_heartbeat, "I11"), (_expired_while_heartbeated(102.6), "I8")],
    ids=["I11", "I8"],
)
def test_timing_findings_are_reported_and_fail_only_when_asked(
    tmp_path: Path, edit: Any, inv: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p, d = copy.deepcopy(legal())
    edit(p, d)
    files = _write(tmp_path, p, d)
    report = check_files(files)
    assert report.ok, [str(v) for v in report.violations]
    assert [v.invariant for v in report.timing.findings] == [inv], report.timing
    strict = check_files(files, timing=True)
    assert [v.invariant for v in strict.violations] == [inv]
    assert main(["check-trace", *map(str, files)]) == 0
    assert main(["check-trace", "--timing", *map(str, files)]) == 1
    assert f": {inv}: " in capsys.readouterr().out


def test_an_expiry_after_a_gap_that_breaks_T2_is_explained(tmp_path: Path) -> None:
    p, d = copy.deepcopy(legal())
    _expired_while_heartbeated(100.9)(p, d)  # 2.3 s without a heartbeat naming b, E = 2 s
    t = check_files(_write(tmp_path, p, d), timing=True).timing
    assert (t.tracked_expiries, t.explained) == (1, 1)
    assert [v.invariant for v in t.findings] == ["I11"]  # the gap itself breaks D's schedule


P1 = "prefill-engine-r1-cccccc"


def _two_p_ranks() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Heterogeneous TP: P of TP 2 (ranks P and P1), D of TP 1 reading a from both;
    P1 grants a, counts D's transfer-done and answers OK; D uses a after both OKs."""
    p, d = legal()
    p1 = [
        {**_header("prefill", P1), "rank": 1, "tp": 2},
        {"ev": "grant", "t": 100.0, "now": 100.0, "req": "a", "consumers": 1, "blocks": 2},
        {"ev": "recv", "t": 102.0, "src": D, "data": "a:1"},
        {"ev": "handle", "t": 102.0, "now": 102.0, "src": D, "data": "a:1"},
        {
            "ev": "release",
            "t": 102.0,
            "req": "a",
            "reason": "transferred",
            "at": 102.0,
            "granted_at": 100.0,
            "deadline": 103.0,
            "last_renewal": None,
            "blocks": 2,
        },
        {"ev": "end", "t": 104.0},
    ]
    p1[1]["lease"] = 3.0
    i = _find(d, ev="read")
    d.insert(i + 1, {"ev": "read", "t": 101.9, "to": P1, "data": "a:1"})
    d[_find(d, ev="use")]["ok_from"] = [P, P1]
    return p, p1, d


def _write3(tmp_path: Path, p: Any, p1: Any, d: Any) -> list[Path]:
    files = _write(tmp_path, p, d)
    path = tmp_path / "prefill-1.trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in p1))
    return [*files, path]


def test_d_uses_a_read_only_after_the_verdict_of_every_p_rank(tmp_path: Path) -> None:
    p, p1, d = _two_p_ranks()
    # P1 never answered (it gives no verdict before D's capability heartbeat): D used the
    # read waiting only for P's OK, though its own use event says it waited for P1's
    report = check_files(_write3(tmp_path, p, p1, d))
    first = report.first()
    assert first is not None and first.invariant == "I13", [str(v) for v in report.violations]
    assert f"before OK from {P1}" in first.message
    # ... and claiming only P's OK does not hide it: P1 gives verdicts and was read from
    d[_find(d, ev="use")]["ok_from"] = [P]
    first = check_files(_write3(tmp_path, p, p1, d)).first()
    assert first is not None and first.invariant == "I13", first
    assert f"from {P1}, which gives verdicts, without waiting for its OK" in first.message
    # D announces it reads verdicts to P1 too, P1 answers OK, D waits for it: legal
    cap = "HB:leaseproto/1"
    p1[2:2] = [
        {"ev": "recv", "t": 100.5, "src": D, "data": cap},
        {"ev": "handle", "t": 100.5, "now": 100.5, "src": D, "data": cap},
        {"ev": "send", "t": 100.5, "to": D, "data": "OK:leaseproto/1", "ok": True},
    ]
    p1.insert(_find(p1, ev="end"), {"ev": "send", "t": 102.0, "to": D, "data": "OK:a", "ok": True})
    d[2:2] = [{"ev": "send", "t": 100.4, "to": P1, "data": cap, "ok": True}]
    d.insert(_find(d, ev="use"), {"ev": "recv", "t": 102.1, "src": P1, "data": "OK:a"})
    d[_find(d, ev="use")]["ok_from"] = [P, P1]
    report = check_files(_write3(tmp_path, p, p1, d))
    assert report.ok, [str(v) for v in report.violations]
    assert report.uses == 1 and report.leases == 3


def test_a_read_from_an_agent_that_greeted_used_unverified_fails(tmp_path: Path) -> None:
    """Once a P agent answered D's hello, D uses no read from it without its
    OK, whatever the request said (issue 17): caught from D's trace alone (P
    untraced here), where P's header cannot say it gives verdicts."""
    _, d = legal()
    d[-1:-1] = [
        {"ev": "read", "t": 103.1, "to": P, "data": "c:1"},
        {"ev": "use", "t": 103.4, "req": "c", "remote": "c", "ok_from": []},
    ]
    path = tmp_path / "decode-0.trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in d))
    first = check_files([path]).first()
    assert first is not None and first.invariant == "I13", first
    assert "without waiting for its OK" in first.message


def test_an_ok_from_an_agent_not_read_does_not_count(tmp_path: Path) -> None:
    """D counts a verdict only from the P agents it read from (issue 17)."""
    p, d = legal()
    use = _find(d, ev="use")
    d[use : use + 1] = [
        {"ev": "recv", "t": 102.1, "src": "third-agent", "data": "OK:a"},
        {"ev": "use", "t": 102.2, "req": "a", "remote": "a", "ok_from": [P, "third-agent"]},
    ]
    first = check_files(_write(tmp_path, p, d)).first()
    assert first is not None and first.invariant == "I13", first
    assert "did not read it from" in first.message
