"""LeaseprotoPushConnector's traces validate with ``check-trace``: a push exchange
(a WRITE on time, used; a WRITE after its registration lapsed, refused and
recomputed; P's lease ended by its own WRITE; heartbeats naming D's id mapped
to P's lease) checks clean on both tables, and a D that used the late WRITE is
an I15 violation; D's push events (the grant's ``writers``, ``quarantine``,
``unquarantine``, ``forget`` of a writer silent past the bound) are checked
too: one missing or out of order is I15. Needs vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from test_vllm_push import TTL, _exchange, _steps
from vllm_push_stubs import D_ID, P_ID, Pair, carry, d_request, make_pair, p_request, record_writes
from vllm_stubs import virtual_clock

from leaseproto.checker.trace import check_files
from leaseproto.integrations.vllm.trace import TracedNixl, open_connector_trace

pytestmark = pytest.mark.vllm

D2, P2 = "cmpl-77aa-0-cccccccc", "cmpl-77aa-0-dddddddd"


def _traced(w: Any, tmp: Path, *, producer: bool, engine: str) -> None:
    lp = w._leases()
    lp.trace = open_connector_trace(
        {"trace_dir": str(tmp)},
        producer=producer,
        engine=engine,
        rank=0,
        tp=1,
        agent=w.nixl_wrapper.name,
        config=lp.config,
        trace_config={"push_registration_timeout": TTL},
    )
    assert isinstance(w.nixl_wrapper, TracedNixl)


def _run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Pair:
    clock = virtual_clock(monkeypatch)
    record_writes(monkeypatch)
    pair = make_pair(clock)
    _traced(pair.d, tmp, producer=False, engine="DEC")
    _traced(pair.p, tmp, producer=True, engine="P0")
    for p_id, d_id in ((P_ID, D_ID), (P2, D2)):
        pair.p_admits(p_request(p_id))
        pair.d_admits(d_request(d_id=d_id))
    _steps(pair, 3.0)  # registered, renewed; D heartbeats nothing of P's yet
    pair.p_prefill_done(p_request(P_ID))
    _steps(pair, 2.0)  # P_ID written on time: used
    _steps(pair, TTL + 9.0, p_runs=False)  # P stalls: D2's registration lapses (held)
    pair.p_prefill_done(p_request(P2))
    pair.p_step()  # its WRITE goes before P hears of the lapse
    _exchange(pair)
    pair.d_step()
    _exchange(pair)
    pair.p_step()
    for w in (pair.d, pair.p):
        w._leases().trace.close()
    return pair


def test_a_push_exchange_checks_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = _run(tmp_path, monkeypatch)
    assert carry(pair.p, pair.d) == []
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert report.ok, report.first()
    assert report.uses == 1  # D_ID's pushed KV; D2's late WRITE was not used
    assert report.leases >= 4 and report.matched > 10
    events = [line for f in tmp_path.glob("prefill-*.jsonl") for line in f.read_text().splitlines()]
    assert any('"ev":"written"' in e for e in events)
    assert any('"ids":["' + P_ID in e for e in events)  # D's heartbeat named D's id (B2)
    d = _decoder_events(tmp_path)
    writers = {e["req"]: e.get("writers") for e in d if e["ev"] == "grant"}
    assert writers == {D_ID: ["p0"], D2: ["p0"]}
    held = [
        (e["ev"], e.get("writers")) for e in d if e.get("req") == D2 and "quarantine" in e["ev"]
    ]
    assert held == [("quarantine", ["p0"]), ("unquarantine", None)]  # until its late completion


def _decoder_events(tmp: Path) -> list[dict[str, Any]]:
    (d_trace,) = tmp.glob("decode-*.jsonl")
    return [json.loads(line) for line in d_trace.read_text().splitlines()]


def _rewrite(tmp: Path, keep: Any) -> None:
    """D's trace without the events ``keep`` says no to."""
    (d_trace,) = tmp.glob("decode-*.jsonl")
    lines = [line for line in d_trace.read_text().splitlines() if keep(json.loads(line))]
    d_trace.write_text("\n".join(lines) + "\n")


def test_freeing_a_lapsed_registration_without_its_quarantine_is_i15(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog-only design, as D's trace would show it: the lapsed D2 freed
    at its release while P0's agent may still write."""
    _run(tmp_path, monkeypatch)
    _rewrite(tmp_path, lambda e: "quarantine" not in e["ev"])
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert {v.invariant for v in report.violations} == {"I15"}
    assert "no quarantine" in str(report.first())


def test_a_writer_silent_past_the_bound_is_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quarantine's time bound (§2.8): P stops for good after D's
    registration lapsed; max(10 kv_lease_duration, max_lease_lifetime) = 120 s
    later D forgets P's agent, which ends the quarantine (recomputed). Checks
    clean; the same unquarantine before the forget is I15."""
    clock = virtual_clock(monkeypatch)
    record_writes(monkeypatch)
    pair = make_pair(clock)
    _traced(pair.d, tmp_path, producer=False, engine="DEC")
    _traced(pair.p, tmp_path, producer=True, engine="P0")
    pair.p_admits(p_request())
    pair.d_admits(d_request())
    _steps(pair, 3.0)
    failed: set[str] = set()
    while not failed and clock["t"] < 1000.0 + 200.0:
        _, failed = _steps(pair, 1.0, p_runs=False)
    assert failed == {D_ID}
    for w in (pair.d, pair.p):
        w._leases().trace.close()
    d = _decoder_events(tmp_path)
    order = [(e["ev"], e.get("agents")) for e in d if e["ev"] in ("forget", "unquarantine")]
    assert order == [("forget", ["p0"]), ("unquarantine", None)]
    (lapse,) = [e["now"] for e in d if e["ev"] == "expire" and e.get("n")]
    (forget,) = [e["now"] for e in d if e["ev"] == "forget"]
    assert 120.0 <= forget - lapse <= 121.0
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert report.ok, report.first()
    _rewrite(tmp_path, lambda e: e["ev"] != "forget")
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert {v.invariant for v in report.violations} == {"I15"}
    assert "may still write" in str(report.first())


def test_using_a_late_write_is_an_i15_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(tmp_path, monkeypatch)
    (d_trace,) = tmp_path.glob("decode-*.jsonl")
    lines = d_trace.read_text().splitlines()
    t = json.loads(lines[-1])["t"]
    bad = {"ev": "use", "t": t, "req": D2, "remote": D2, "kind": "push"}  # a D that used it
    d_trace.write_text("\n".join([*lines[:-1], json.dumps(bad), lines[-1]]) + "\n")
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert not report.ok
    assert {v.invariant for v in report.violations} == {"I15"}
    assert "registration lease had ended" in str(report.first())
