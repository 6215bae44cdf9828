"""check-trace with the lease in the other direction (spec §2.8): D's trace, which
has ``grant`` events of kind ``turn`` or ``push``, is replayed as a grantor table;
P's ``use`` of kind ``prefix`` is checked against D's verdicts (I14); D's ``use``
of kind ``push`` against its own table (I15); ``recompute`` events are counted.
The traces are the legal run of tests/test_check_trace.py with P and D swapped."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from test_check_trace import CONFIG, D, P, _find, legal
from test_check_trace import _write as write_traces

from leaseproto.checker.trace import check_files

TURN_CONFIG = {**CONFIG, "decoder_kv_blocks_ttl": 3.0}


def _swap(agent: Any) -> Any:
    return {P: D, D: P}.get(agent, agent)


def mirrored(kind: str = "turn") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(D's trace: the grantor, P's trace: the reader) of the legal run mirrored."""
    p, d = copy.deepcopy(legal())
    grantor, reader = p, d
    for role, agent, events in (("decode", D, grantor), ("prefill", P, reader)):
        events[0].update(role=role, agent=agent, config=TURN_CONFIG)
        for e in events[1:]:
            for key in ("src", "to"):
                if key in e:
                    e[key] = _swap(e[key])
            if e["ev"] == "grant":
                e["kind"] = kind
            if e["ev"] == "use":
                e.update(kind="prefix", ok_from=[D])
    return grantor, reader


def _write(tmp_path: Path, d: list[dict[str, Any]], p: list[dict[str, Any]]) -> list[Path]:
    return write_traces(tmp_path, p, d)


def test_a_legal_turn2_read_passes(tmp_path: Path) -> None:
    report = check_files(_write(tmp_path, *mirrored()))
    assert report.ok, [str(v) for v in report.violations]
    assert (report.leases, report.releases, report.uses, report.prefix_uses) == (2, 2, 1, 1)


def test_d_s_table_is_replayed_though_its_role_is_decode(tmp_path: Path) -> None:
    d, p = mirrored()
    i = _find(d, ev="send", data="OK:a")
    d.insert(i + 1, {"ev": "renew", "t": 102.0, "now": 102.0, "leases": {"b": 2.0}})
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "I6"


def test_a_turn_grant_with_p_s_lease_is_a_violation(tmp_path: Path) -> None:
    d, p = mirrored()
    config = {**TURN_CONFIG, "decoder_kv_blocks_ttl": 9.0}  # the grants say 3 s
    d[0]["config"] = p[0]["config"] = config
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "I5"


def test_a_prefix_used_before_d_s_ok_breaks_i14(tmp_path: Path) -> None:
    d, p = mirrored()
    use = p.pop(_find(p, ev="use"))
    p.insert(_find(p, ev="recv", data="OK:a"), use)
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "I14", first


def test_a_prefix_read_of_an_expired_cached_lease_used_breaks_i14(tmp_path: Path) -> None:
    # P reads b after D expired it, D answers NK, P uses it anyway (gate-only)
    d, p = mirrored()
    p[-1:-1] = [
        {"ev": "read", "t": 103.1, "to": D, "data": "b:1"},
        {"ev": "recv", "t": 103.3, "src": D, "data": "NK:expired:b"},
        {"ev": "use", "t": 103.4, "req": "b2", "kind": "prefix", "remote": "b", "ok_from": []},
    ]
    d[-1:-1] = [
        {"ev": "recv", "t": 103.2, "src": P, "data": "b:1"},
        {"ev": "handle", "t": 103.2, "now": 103.2, "src": P, "data": "b:1"},
        {"ev": "send", "t": 103.2, "to": P, "data": "NK:expired:b", "ok": True},
    ]
    report = check_files(_write(tmp_path, d, p))
    assert [v.invariant for v in report.violations] == ["I14"], [str(v) for v in report.violations]
    # recomputing instead is legal, and counted
    p[-2] = {"ev": "recompute", "t": 103.4, "req": "b2", "reason": "nack", "remote": "b"}
    report = check_files(_write(tmp_path, d, p))
    assert report.ok and report.recomputes == 1, [str(v) for v in report.violations]


def test_a_recompute_without_a_known_reason_is_a_format_violation(tmp_path: Path) -> None:
    d, p = mirrored()
    p.insert(-1, {"ev": "recompute", "t": 103.5, "req": "c", "reason": "felt like it"})
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "format"


def _push(d: list[dict[str, Any]], *, at: float) -> None:
    d.insert(-1, {"ev": "use", "t": at, "req": "a", "kind": "push", "remote": "a"})


def test_pushed_kv_is_used_only_after_a_completion_handled_while_live(tmp_path: Path) -> None:
    d, p = mirrored("push")
    d[0]["config"] = p[0]["config"] = {**TURN_CONFIG, "push_registration_timeout": 3.0}
    p.pop(_find(p, ev="use"))
    _push(d, at=102.1)
    report = check_files(_write(tmp_path, d, p))
    assert report.ok, [str(v) for v in report.violations]
    # before D handled P's write completion: I15
    d2 = [e for e in d if e["ev"] != "use"]
    d2.insert(_find(d2, ev="handle", data="a:1"), {**d[_find(d, ev="use")], "t": 101.9})
    first = check_files(_write(tmp_path, d2, p)).first()
    assert first is not None and first.invariant == "I15", first


@pytest.mark.parametrize("kind", ["lease", "other"])
def test_unknown_kinds_are_format_violations(tmp_path: Path, kind: str) -> None:
    d, p = mirrored(kind)
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "format"


def test_a_gate_only_reader_is_flagged_only_where_the_read_was_stale(tmp_path: Path) -> None:
    # `serve prefill --turn-reads gate-only`: header verify_reads false, no hello, no OK
    # awaited. A use of a live lease is what vLLM does, not a violation; the same use
    # by a P that verifies (D gives verdicts) is one.
    d, p = mirrored()
    use = p[_find(p, ev="use")]
    use["ok_from"] = []
    p[0]["verify_reads"] = False
    report = check_files(_write(tmp_path, d, p))
    assert report.ok, [str(v) for v in report.violations]
    p[0]["verify_reads"] = True
    first = check_files(_write(tmp_path, d, p)).first()
    assert first is not None and first.invariant == "I14" and "without waiting" in first.message
    # a stale read is named with the grantor that handled its transfer-done: D
    p[0]["verify_reads"] = False
    p[-1:-1] = [
        {"ev": "read", "t": 103.1, "to": D, "data": "b:1"},
        {"ev": "use", "t": 103.2, "req": "b2", "kind": "prefix", "remote": "b", "ok_from": []},
    ]
    d[-1:-1] = [  # (D answers NK: this P greeted it in the run the fixture mirrors)
        {"ev": "recv", "t": 103.3, "src": P, "data": "b:1"},
        {"ev": "handle", "t": 103.3, "now": 103.3, "src": P, "data": "b:1"},
        {"ev": "send", "t": 103.3, "to": P, "data": "NK:expired:b", "ok": True},
    ]
    report = check_files(_write(tmp_path, d, p))
    first = report.first()
    assert first is not None and first.invariant == "I14"
    assert "ended when D handled its transfer-done" in first.message, first.message
    assert report.as_dict()["by_invariant"] == {"I14": 1}  # what the demo's table shows
