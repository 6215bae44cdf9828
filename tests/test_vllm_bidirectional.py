"""Bidirectional mode in LeaseprotoConnector (issue 18, I14/I16): D's cached turn
is a lease in D's table, P's turn-2 read of it is verified (used only after D's
``OK:``), P heartbeats D while the turn-2 request waits, and vLLM's clock-offset
gate stays as the pre-check. vLLM's own scheduler and worker code runs
(``request_finished``, ``build_connector_meta``, ``_read_blocks_for_req`` with
its gate); only the NIXL post is replaced. A virtual clock. Needs vLLM."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_stubs import (
    make_finishing_scheduler,
    make_reader,
    make_worker,
    record_reads,
    virtual_clock,
    worker_stat,
)

from leaseproto.integrations.vllm.tracking import PARAMS_KEY, VERIFY_ATTR

pytestmark = pytest.mark.vllm

TTL = 24  # decoder_kv_blocks_ttl


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return record_reads(monkeypatch)


def _scheduler(ours: bool, engine: str) -> Any:
    s = make_finishing_scheduler(ours, engine, bidirectional=True)
    s.decoder_kv_blocks_ttl = TTL
    s.kv_recompute_threshold = 0  # vLLM's default: read any remote prefix
    s.use_host_buffer = False
    return s


def _turn1_on_d(ours: bool) -> tuple[Any, dict[str, Any]]:
    """Turn 1 finishes on D (bidirectional): vLLM's request_finished keeps the
    blocks for decoder_kv_blocks_ttl and returns where they are."""
    from vllm.v1.request import RequestStatus

    s = _scheduler(ours, "DEC")
    req = SimpleNamespace(
        request_id="d1",
        status=RequestStatus.FINISHED_LENGTH_CAPPED,
        num_computed_tokens=64,
        kv_transfer_params={"do_remote_prefill": False, "_remote_blocks_processed": True},
    )
    delay, params = s.request_finished(req, ([5, 6],))
    assert delay and params is not None and params["do_remote_decode"]
    return s, params


def _d_worker(clock: dict[str, float], d_sched: Any) -> Any:
    """D's worker (agent ``p0``: the name make_reader gives rank 0 of the engine it
    reads) with the cached turn granted as vLLM's start_load_kv grants it."""
    d = make_worker(True, kv_lease_duration=12, name="p0")
    d._reqs_to_process.add("d1")
    d._reqs_to_send["d1"] = d_sched._reqs_need_send["d1"]
    return d


def _p_reader(clock: dict[str, float], d_params: dict[str, Any]) -> tuple[Any, Any]:
    """P's scheduler and worker for turn 2, whose parameters are D's turn-1 answer."""
    p_sched = _scheduler(True, "P0")
    turn2 = SimpleNamespace(request_id="t2", kv_transfer_params=dict(d_params))
    p_sched._reqs_need_recv["t2"] = (turn2, ([0, 1],), (), True)
    meta = p_sched.build_connector_meta(MagicMock())
    p = make_reader(1, 0, 1, engine="DEC", name="P-agent", kv_lease_duration=12)
    p._bidirectional_kv_xfer_enabled = True
    p._engine_clock_offset = {"DEC": 0.0}  # same host: vLLM's handshake measured ~0
    p._lp_set("_lp_advertised").update(getattr(meta, VERIFY_ATTR, ()))
    return p, meta.reqs_to_recv["t2"]


def _carry(src: Any, dst: Any) -> None:
    for _, msg in src.nixl_wrapper.sent:
        dst.nixl_wrapper.deliver(src.nixl_wrapper.name, msg)
    src.nixl_wrapper.sent = []


def _read_turn2(
    clock: dict[str, float], posted: list[dict[str, Any]], pause: float
) -> tuple[Any, Any, list[tuple[str, bytes]], tuple[set[str], set[str]]]:
    """P passes vLLM's gate, posts the READ, pauses ``pause`` s, then the READ's
    transfer-done reaches D; returns D, P, what D answered and what P reports
    (done, failed)."""
    d_sched, params = _turn1_on_d(True)
    d = _d_worker(clock, d_sched)
    p, req_meta = _p_reader(clock, params)
    p._read_blocks_for_req("t2", req_meta)
    assert len(posted) == 1, "vLLM's gate admitted the read"
    p._recving_transfers["t2"] = [7]
    assert p._pop_done_transfers(p._recving_transfers) == (set(), set())  # held
    clock["t"] += pause
    d._reap_expired_send_leases(set())
    _carry(p, d)  # hello, then the READ's own transfer-done
    call = posted[0]
    d.nixl_wrapper.deliver(
        "P-agent", f"{call['remote_request_id']}:{call['expected_consumers']}".encode()
    )
    d._get_new_notifs()
    answered = list(d.nixl_wrapper.sent)
    _carry(d, p)
    p._get_new_notifs()
    return d, p, answered, p._pop_done_transfers({})


def test_d_advertises_its_cached_turn() -> None:
    _, params = _turn1_on_d(True)
    assert params[PARAMS_KEY]["kind"] == "turn"
    assert params[PARAMS_KEY]["lease"]["kv_lease_duration"] == TTL
    _, stock = _turn1_on_d(False)
    assert PARAMS_KEY not in stock  # a stock D sends nothing of ours


def test_gate_admitted_read_of_an_expired_turn_is_not_used(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """I14, the gate-only defect: P passes vLLM's 5 s gate, then stalls past D's
    deadline before the READ completes; D has freed the blocks. Old main used the
    read (unverified); now D answers NK and P fails the recv (recompute)."""
    _, p, answered, reported = _read_turn2(clock, posted, pause=TTL + 1.0)
    assert ("P-agent", b"NK:expired:d1") in answered
    assert reported == ({"t2"}, {"t2"})  # failed: vLLM recomputes the prefix
    assert worker_stat(p, "lp_reads_refused") == 1 and worker_stat(p, "lp_reads_verified") == 0


def test_live_turn_is_used_after_ok_and_d_frees(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    d, p, answered, reported = _read_turn2(clock, posted, pause=1.0)
    assert ("P-agent", b"OK:d1") in answered
    assert reported == ({"t2"}, set())
    assert worker_stat(p, "lp_reads_verified") == 1
    done: set[str] = set()
    d._reap_expired_send_leases(done)
    assert "d1" not in d._reqs_to_send  # released by P's transfer-done


def _step(p_sched: Any, p: Any, d: Any) -> None:
    """One engine step on P (heartbeats due) and on D (notifications, reaper)."""
    p._send_heartbeats(p_sched.build_connector_meta(MagicMock()))
    _carry(p, d)
    d._get_new_notifs()
    d._reap_expired_send_leases(set())


def test_p_heartbeats_d_while_turn2_waits(clock: dict[str, float]) -> None:
    """I16: from on_new_request until its read is done, P renews D's cached turn,
    so it outlives decoder_kv_blocks_ttl while turn 2 waits on an overloaded P;
    once P goes silent D frees it by last heartbeat + lease_extension."""
    d_sched, params = _turn1_on_d(True)
    d = _d_worker(clock, d_sched)
    p_sched = _scheduler(True, "P0")
    p = make_reader(1, 0, 1, engine="DEC", name="P-agent", kv_lease_duration=12)
    p_sched.on_new_request(SimpleNamespace(request_id="t2", kv_transfer_params=dict(params)))
    assert p_sched._heartbeat_req_engine == {"t2": ("DEC", "d1")}
    start = clock["t"]
    sent_before = len(p.nixl_wrapper.sent)
    p._send_heartbeats(p_sched.build_connector_meta(MagicMock()))
    assert p.nixl_wrapper.sent[sent_before:] == [(b"p0", b"HB:d1")]  # at once: a new engine
    while clock["t"] < start + TTL + 6:
        clock["t"] += 1.0
        _step(p_sched, p, d)
        assert "d1" in d._reqs_to_send, clock["t"] - start
    assert worker_stat(d, "lp_leases_renewed") >= 1
    last = clock["t"]
    p_sched.update_connector_output(SimpleNamespace(finished_recving={"t2"}))
    assert p_sched._heartbeat_req_engine == {}  # the read is done: nothing more to renew
    while "d1" in d._reqs_to_send:
        clock["t"] += 1.0
        _step(p_sched, p, d)
    assert clock["t"] - last <= 8.0 + 1.0  # lease_extension of kv_lease_duration 12, one step


def test_a_stock_d_is_read_unverified_and_not_heartbeated(
    clock: dict[str, float], posted: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM does not track P-bound requests; a stock D's turn (no advertisement)
    gets nothing of ours from P, and P uses the read unverified, saying so once."""
    _, params = _turn1_on_d(False)
    p_sched = _scheduler(True, "P0")
    p_sched.on_new_request(SimpleNamespace(request_id="t2", kv_transfer_params=dict(params)))
    assert p_sched._heartbeat_req_engine == {}
    p, req_meta = _p_reader(clock, params)
    assert p._lp_set("_lp_advertised") == set()
    with caplog.at_level("WARNING", logger="vllm.leaseproto.worker"):
        p._read_blocks_for_req("t2", req_meta)
        p._read_blocks_for_req("t2", req_meta)
    assert sum("used unverified" in r.getMessage() for r in caplog.records) == 1
    p._recving_transfers["t2"] = [7]
    assert p._pop_done_transfers(p._recving_transfers) == ({"t2"}, set())
    assert p.nixl_wrapper.sent == []  # nothing of ours to a stock D


def _turn2(params: dict[str, Any]) -> Any:
    """A turn-2 request on P: turn 1 (64 tokens, cached on D) and 36 new ones."""
    return SimpleNamespace(
        request_id="t2",
        kv_transfer_params=dict(params),
        num_prompt_tokens=100,
        prompt_token_ids=list(range(100)),
    )


def _allocated(n: int) -> Any:
    """What vLLM's scheduler hands update_state_after_alloc: ``n`` fresh blocks."""
    blocks = MagicMock()
    blocks.get_unhashed_block_ids_all_groups.return_value = (list(range(n)),)
    blocks.blocks = ([SimpleNamespace(block_hash=None, is_null=False)] * n,)
    return blocks


@pytest.mark.parametrize("ours", [True, False], ids=["leaseproto", "stock"])
def test_a_failed_turn2_read_is_prefilled_locally_not_parked_for_ever(ours: bool) -> None:
    """vLLM's scheduler asks get_num_new_matched_tokens again once a failed read
    (recompute policy: an NK, no verdict in time) or a preemption put the request
    back to no computed tokens. Stock vLLM answers D's count again, so the request
    waits in WAITING_FOR_REMOTE_KVS, but sets up no second read: nothing ever ends
    the wait (a real engine hung so, tests/test_vllm_pd.py). P prefills it locally."""
    _, params = _turn1_on_d(True)
    p_sched = _scheduler(ours, "P0")
    req = _turn2(params)
    assert p_sched.get_num_new_matched_tokens(req, 0) == (64, True)  # read D's 64 tokens
    p_sched.update_state_after_alloc(req, _allocated(2), 64)
    assert "t2" in p_sched._reqs_need_recv  # the one read, for the worker
    p_sched._reqs_need_recv.clear()  # shipped by build_connector_meta
    again = p_sched.get_num_new_matched_tokens(req, 0)  # the read failed: asked again
    p_sched.update_state_after_alloc(req, _allocated(4), again[0])
    if ours:
        assert again == (0, False)  # prefilled here, from its tokens
    else:  # vLLM 0.32: parked for a load with no read behind it
        assert again == (64, True)
    assert "t2" not in p_sched._reqs_need_recv  # either way no second read


@pytest.mark.parametrize("ours", [True, False], ids=["leaseproto", "stock"])
def test_a_p_not_in_bidirectional_mode_prefills_a_turn2_request(ours: bool) -> None:
    """D's parameters reaching a P without bidirectional_kv_xfer: stock vLLM parks
    the request for a load it never sets up; ours prefills it locally."""
    _, params = _turn1_on_d(True)
    p_sched = make_finishing_scheduler(ours, "P0", bidirectional=False)
    p_sched.kv_recompute_threshold, p_sched.use_host_buffer = 0, False
    req = _turn2(params)
    got = p_sched.get_num_new_matched_tokens(req, 0)
    p_sched.update_state_after_alloc(req, _allocated(4), got[0])
    assert "t2" not in p_sched._reqs_need_recv
    assert got == ((0, False) if ours else (64, True))
