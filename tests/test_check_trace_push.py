"""check-trace of push exchanges (spec §2.8, I15; ``checker/trace_push.py``): D's
trace grants push registrations naming their writers, P WRITEs and sends its
write completion, D uses the pushed KV only after its own table answered every
writer's completion while the registration was live, and a registration that
lapsed with a writer owed is quarantined until that writer's completion or abort
was handled, or its agent forgotten. One legal exchange passes; each violation
names its invariant and line.

The run (the legal run of tests/test_check_trace.py mirrored, as
tests/test_check_trace_turn2.py has it): registration ``a`` is heartbeated by P,
written at 101.9 and used by D at 102.1; registration ``b`` lapses at 103 while P
(paused) still holds it, so D quarantines its blocks; P's abort at 103.5 ends the
quarantine."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from test_check_trace import _find
from test_check_trace_turn2 import TURN_CONFIG, _write, mirrored

from leaseproto.checker import trace
from leaseproto.checker.trace import check_files
from leaseproto.cli import main

P, D = "prefill-engine-r0-aaaaaa", "decode-r0-bbbbbb"
P2 = "prefill-engine-r1-cccccc"
PUSH_CONFIG = {**TURN_CONFIG, "push_registration_timeout": 3.0}

Events = list[dict[str, Any]]


def legal() -> tuple[Events, Events]:
    """(D's trace: the grantor, P's trace: the writer) of one legal push exchange."""
    d, p = mirrored("push")
    for events in (d, p):
        events[0]["config"] = PUSH_CONFIG
    for e in d:
        if e["ev"] == "grant":
            e["writers"] = [P]
    i = _find(p, ev="read")
    p[i]["ev"] = "write"  # the WRITE, and the completion NIXL delivers after it
    p.pop(_find(p, ev="use"))
    d.insert(_find(d, ev="send", data="OK:a") + 1, _use("a", 102.1))
    d[-1:-1] = [
        {"ev": "quarantine", "t": 103.0, "req": "b", "writers": [P]},
        {"ev": "recv", "t": 103.5, "src": P, "data": "AB:b"},
        {"ev": "handle", "t": 103.5, "now": 103.5, "src": P, "data": "AB:b"},
        {"ev": "unquarantine", "t": 103.5, "req": "b"},
    ]
    p.insert(-1, {"ev": "send", "t": 103.4, "to": D, "data": "AB:b", "ok": True})
    return d, p


def _use(req: str, t: float) -> dict[str, Any]:
    return {"ev": "use", "t": t, "req": req, "kind": "push", "remote": req}


def _check(tmp_path: Path, d: Events, p: Events) -> list[str]:
    report = check_files(_write(tmp_path, d, p))
    return [f"{v.invariant} {v.message}" for v in report.violations]


def test_a_legal_push_exchange_passes(tmp_path: Path) -> None:
    report = check_files(_write(tmp_path, *legal()))
    assert report.ok, [str(v) for v in report.violations]
    assert (report.leases, report.releases, report.push_uses) == (2, 2, 1)
    assert report.matched == 7  # P's write completion among them (its write event)
    assert main(["check-trace", *map(str, _write(tmp_path, *legal()))]) == 0


def _late_write_used(d: Events, p: Events) -> None:
    """P writes b after its registration lapsed, D answers NK and uses it anyway."""
    i = _find(p, ev="send", data="AB:b")
    p[i] = {"ev": "write", "t": 103.4, "to": D, "data": "b:1"}
    j = _find(d, ev="recv", data="AB:b")
    d[j : j + 3] = [
        {"ev": "recv", "t": 103.5, "src": P, "data": "b:1"},
        {"ev": "handle", "t": 103.5, "now": 103.5, "src": P, "data": "b:1"},
        {"ev": "send", "t": 103.5, "to": P, "data": "NK:expired:b", "ok": True},
        _use("b", 103.6),
    ]


def _used_before_completion(d: Events, p: Events) -> None:
    use = d.pop(_find(d, ev="use"))
    d.insert(_find(d, ev="recv", data="a:1"), {**use, "t": 101.95})


def _watchdog_only(d: Events, p: Events) -> None:
    """The one-shot watchdog: b's blocks go back at the lapse, no quarantine."""
    del d[_find(d, ev="quarantine")]
    del d[_find(d, ev="unquarantine")]


def _released_before_the_abort(d: Events, p: Events) -> None:
    unq = d.pop(_find(d, ev="unquarantine"))
    d.insert(_find(d, ev="recv", data="AB:b"), {**unq, "t": 103.2})


def _quarantine_without_the_writer(d: Events, p: Events) -> None:
    d[_find(d, ev="grant", req="b")]["writers"] = [P, P2]  # the quarantine names only P
    i = _find(d, ev="expire", now=103.0)  # P2 said leaseproto/1: it completes or aborts
    d[i:i] = [
        {"ev": "recv", "t": 102.5, "src": P2, "data": "HB:leaseproto/1"},
        {"ev": "handle", "t": 102.5, "now": 102.5, "src": P2, "data": "HB:leaseproto/1"},
        {"ev": "send", "t": 102.5, "to": P2, "data": "OK:leaseproto/1", "ok": True},
    ]


def _one_writer_of_two(d: Events, p: Events) -> None:
    """D uses a after P's completion only (``n`` = 2: its table counts it and answers
    OK), though P2 was registered to write a too."""
    d[_find(d, ev="grant", req="a")]["writers"] = [P, P2]
    for events in (d, p):
        for e in events:
            if e.get("data") == "a:1":
                e["data"] = "a:2"
    del d[_find(d, ev="release", req="a")]  # live until the trace ends


#: name -> (the defect, the invariant its first violation names)
DEFECTS = {
    "pushed KV used after a late completion D answered NK": (_late_write_used, "I15"),
    "pushed KV used before the write completion": (_used_before_completion, "I15"),
    "a lapsed registration freed without quarantine (watchdog-only)": (_watchdog_only, "I15"),
    "a quarantine released before the writer's abort": (_released_before_the_abort, "I15"),
    "a quarantine that leaves out an owed writer": (_quarantine_without_the_writer, "I15"),
    "pushed KV used after one of two writers": (_one_writer_of_two, "I15"),
}


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_each_push_defect_fails_naming_its_invariant(tmp_path: Path, name: str) -> None:
    defect, invariant = DEFECTS[name]
    d, p = copy.deepcopy(legal())
    defect(d, p)
    report = check_files(_write(tmp_path, d, p))
    first = report.first()
    assert first is not None, f"{name}: not caught"
    assert first.invariant == invariant, [str(v) for v in report.violations]


def test_the_violations_say_what_went_wrong(tmp_path: Path) -> None:
    cases = {
        _late_write_used: "whose registration lease had ended when its write completion",
        _used_before_completion: "before handling a write completion",
        _watchdog_only: "freed b's blocks at its release while",
        _released_before_the_abort: "returned b's blocks to the pool while",
        _quarantine_without_the_writer: f"quarantined b without {P2}",
        _one_writer_of_two: f"before a write completion from {P2}",
    }
    for defect, text in cases.items():
        d, p = copy.deepcopy(legal())
        defect(d, p)
        got = _check(tmp_path, d, p)
        assert any(text in v for v in got), (defect.__name__, got)


def test_forgetting_the_writer_ends_the_quarantine(tmp_path: Path) -> None:
    """P's agent forgotten (D's transport noticed it was gone) settles it: the
    blocks may go back without its abort."""
    d, p = legal()
    j = _find(d, ev="recv", data="AB:b")
    d[j : j + 2] = [{"ev": "forget", "t": 103.5, "now": 103.5, "agents": [P]}]
    p.pop(_find(p, ev="send", data="AB:b"))
    assert _check(tmp_path, d, p) == []


def test_a_writer_forgotten_before_the_grant_is_owed_again(tmp_path: Path) -> None:
    """A forget settles the registrations granted before it, not later ones (the
    core's ``forget``): D forgot P, registered ``b`` with it again, and freeing
    ``b``'s quarantine without P's abort is I15."""
    d, p = legal()
    d.insert(_find(d, ev="grant", req="b"), {"ev": "forget", "t": 100.0, "agents": [P]})
    assert _check(tmp_path, d, p) == []
    _released_before_the_abort(d, p)
    assert any(v.startswith("I15") for v in _check(tmp_path, d, p))


def test_a_writer_that_never_said_leaseproto_is_not_waited_for(tmp_path: Path) -> None:
    """D's stock fallback (§2.8 "Stock peers"): a P that never sent its capability
    heartbeat never aborts, and D frees a lapsed registration of it at once,
    unverified. Only a writer that said ``leaseproto/1`` is owed a quarantine."""
    d, p = legal()
    _watchdog_only(d, p)
    assert any(v.startswith("I15") for v in _check(tmp_path, d, p))
    stock = ("HB:leaseproto/1", "OK:leaseproto/1", "OK:a")  # and no verdicts for it
    d = [e for e in d if e.get("data") not in stock]
    p = [e for e in p if e.get("data") not in stock]
    assert _check(tmp_path, d, p) == []


def test_a_late_completion_ends_the_quarantine_and_is_not_used(tmp_path: Path) -> None:
    d, p = legal()
    _late_write_used(d, p)
    d.pop(_find(d, ev="use", req="b"))
    assert _check(tmp_path, d, p) == []


def test_without_writers_in_the_grant_the_use_is_still_checked(tmp_path: Path) -> None:
    """An older trace (grants without ``writers``): the quarantine's checks have
    nothing to go on, the fence still holds (a use before its completion)."""
    d, p = legal()
    for e in d:
        e.pop("writers", None) if e["ev"] == "grant" else None
    _watchdog_only(d, p)
    assert _check(tmp_path, d, p) == []
    _used_before_completion(d, p)
    assert [v.split(" ")[0] for v in _check(tmp_path, d, p)] == ["I15"]


@pytest.mark.parametrize(
    ("event", "text"),
    [
        ({"ev": "unquarantine", "t": 102.5, "req": "a"}, "never quarantined"),
        ({"ev": "quarantine", "t": 102.5, "req": "zz", "writers": [P]}, "not a push registration"),
        ({"ev": "quarantine", "t": 102.5, "req": "a", "writers": "P"}, "malformed"),
    ],
)
def test_malformed_push_events_are_format_violations(
    tmp_path: Path, event: dict[str, Any], text: str
) -> None:
    d, p = legal()
    d.insert(_find(d, ev="expire", now=103.0), event)
    got = _check(tmp_path, d, p)
    assert got and got[0].startswith("format") and text in got[0], got


def test_a_write_nobody_logged_is_a_network_violation(tmp_path: Path) -> None:
    d, p = legal()
    p.pop(_find(p, ev="write"))
    assert any(v.startswith("§3.1") for v in _check(tmp_path, d, p))


@pytest.mark.parametrize(
    "defect", [_watchdog_only, _released_before_the_abort, _quarantine_without_the_writer]
)
def test_the_quarantine_defects_are_caught_only_by_its_checks(
    tmp_path: Path, defect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grantor table's replay and the fence see nothing wrong in these traces:
    the quarantine's own checks (``check_push_events``) are what catches them."""
    monkeypatch.setattr(trace, "check_push_events", lambda events: [])
    d, p = copy.deepcopy(legal())
    defect(d, p)
    assert _check(tmp_path, d, p) == []
