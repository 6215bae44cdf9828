"""LeaseprotoPushConnector's traces validate with ``check-trace``: a push exchange
(a WRITE on time, used; a WRITE after its registration lapsed, refused and
recomputed; P's lease ended by its own WRITE; heartbeats naming D's id mapped
to P's lease) checks clean on both tables, and a D that used the late WRITE is
an I15 violation. Needs vLLM."""

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
