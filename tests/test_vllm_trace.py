"""LeaseprotoConnector's event traces (``kv_connector_extra_config: {"trace_dir": DIR}``)
are the workers' format, and ``check-trace`` validates them: a verified read
through vLLM's own ``_read_blocks_for_req`` checks clean; a D that uses a read P
refused, and a grant longer than the initial lease, are violations naming their
invariant. A virtual lease clock. Needs vLLM."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_stubs import make_reader, make_worker, recv_meta, virtual_clock, worker_stat

from leaseproto.checker.trace import check_files
from leaseproto.integrations.vllm.trace import TracedNixl, open_connector_trace, trace_dir

pytestmark = pytest.mark.vllm


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """vLLM's NIXL post of one READ: the transfer-done goes as the READ's
    ``notif_msg``, as vLLM 0.32's ``_read_blocks`` builds it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
        NixlPullConnectorWorker,
    )

    calls: list[dict[str, Any]] = []

    def post(self: Any, **kw: Any) -> bool:
        calls.append(kw)
        notif = f"{kw['remote_request_id']}:{kw['expected_consumers']}".encode()
        self.nixl_wrapper.make_prepped_xfer("READ", 0, [], 0, [], notif_msg=notif)
        return True

    monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks", post)
    return calls


def _traced(w: Any, tmp: Path, *, producer: bool) -> None:
    lp = w._leases()
    lp.trace = open_connector_trace(
        {"trace_dir": str(tmp)},
        producer=producer,
        engine="P0" if producer else "D0",
        rank=0,
        tp=1,
        agent=w.nixl_wrapper.name,
        config=lp.config,
    )


def _carry(src: Any, dst: Any) -> None:
    raw = src.nixl_wrapper.inner
    for _, msg in raw.sent:
        dst.nixl_wrapper.inner.deliver(raw.name, msg)
    raw.sent = []


def _run(tmp: Path, clock: dict[str, float], late: bool) -> tuple[Any, Any]:
    """P grants p1; D reads it (vLLM's path), P answers, D settles; ``late``: the
    lease expires before P handles the transfer-done."""
    p = make_worker(True, name="p0")
    d = make_reader(1, 0, 1, name="d0")
    _traced(p, tmp, producer=True)
    _traced(d, tmp, producer=False)
    assert isinstance(p.nixl_wrapper, TracedNixl)
    p._reqs_to_process.add("p1")
    p._reqs_to_send["p1"] = clock["t"] + 10.5  # stamped 1.5 s ago by vLLM's scheduler
    d._lp_set("_lp_advertised").add("d1")
    d._read_blocks_for_req("d1", recv_meta("d1", "p1"))
    d._recving_transfers["d1"] = [7]
    d._pop_done_transfers(d._recving_transfers)
    if late:
        clock["t"] += 11.0
        p._reap_expired_send_leases(set())
    _carry(d, p)  # the hello
    for msg in d.nixl_wrapper.inner.xfers:  # what NIXL delivers after the READ
        p.nixl_wrapper.inner.deliver("d0", msg)
    p._get_new_notifs()
    p._reap_expired_send_leases(set())
    _carry(p, d)
    d._get_new_notifs()
    d._pop_done_transfers({})
    for w in (p, d):
        w._leases().trace.close()
    return p, d


def test_a_verified_read_checks_clean(
    tmp_path: Path, clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    p, d = _run(tmp_path, clock, late=False)
    assert worker_stat(d, "lp_reads_verified") == 1
    assert worker_stat(p, "lp_leases_granted") == 1  # vllm:leaseproto_leases_granted
    files = sorted(tmp_path.glob("*.jsonl"))
    assert [f.name.split("-")[0] for f in files] == ["decode", "prefill"]
    report = check_files(files)
    assert report.ok, [str(v) for v in report.violations]
    assert (report.leases, report.releases, report.uses) == (1, 1, 1)
    assert report.matched >= 3  # hello, transfer-done, OK: each matched to its send
    grant = next(
        json.loads(line)
        for line in files[1].read_text().splitlines()
        if json.loads(line)["ev"] == "grant"
    )
    assert grant["lease"] == pytest.approx(10.5) and grant["rebased"] is True


def test_a_refused_read_used_anyway_is_an_i13_violation(
    tmp_path: Path,
    clock: dict[str, float],
    posted: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="vllm.leaseproto")
    _, d = _run(tmp_path, clock, late=True)
    assert worker_stat(d, "lp_reads_refused") == 1
    # P says what it did and what D will do, not an ERROR; D says it refused the read
    (p_line,) = [r for r in caplog.records if "late transfer-done" in r.getMessage()]
    assert p_line.levelno == logging.INFO and "answered NK:expired" in p_line.getMessage()
    (d_line,) = [r for r in caplog.records if "read refused" in r.getMessage()]
    assert d_line.levelno == logging.WARNING and "NK:expired from p0" in d_line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    files = sorted(tmp_path.glob("*.jsonl"))
    assert check_files(files).ok
    # the same run, with D's trace saying it used the read anyway
    dec = files[0]
    lines = dec.read_text().splitlines()
    use = {"ev": "use", "t": json.loads(lines[-2])["t"], "req": "d1", "remote": "p1"}
    lines.insert(-1, json.dumps({**use, "ok_from": ["p0"]}))
    dec.write_text("\n".join(lines) + "\n")
    report = check_files(files)
    assert [v.invariant for v in report.violations] == ["I13"]


def test_a_rebased_grant_longer_than_the_initial_lease_is_an_i5_violation(
    tmp_path: Path, clock: dict[str, float]
) -> None:
    p = make_worker(True, name="p0")
    _traced(p, tmp_path, producer=True)
    p._reqs_to_send["p1"] = clock["t"] + 31.0  # kv_lease_duration is 30
    p._leases().trace.close()
    report = check_files(sorted(tmp_path.glob("*.jsonl")))
    assert [v.invariant for v in report.violations] == ["I5"]


def test_trace_dir_is_checked() -> None:
    assert trace_dir({}) is None and trace_dir(None) is None
    assert trace_dir({"trace_dir": "/x"}) == Path("/x")
    with pytest.raises(ValueError, match="trace_dir"):
        trace_dir({"trace_dir": 3})
