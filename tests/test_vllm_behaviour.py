"""LeaseprotoConnector's behaviour where it differs from stock vLLM 0.32 on purpose,
each checked on both (same calls, same virtual clock). Needs vLLM."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_stubs import (
    d_request,
    make_finishing_scheduler,
    make_reader,
    make_scheduler,
    make_worker,
    recv_meta,
    virtual_clock,
    worker_stat,
)

from leaseproto.integrations.vllm.scheduler import LeaseprotoConnectorScheduler
from leaseproto.integrations.vllm.tracking import PARAMS_KEY
from leaseproto.integrations.vllm.worker import LeaseprotoConnectorWorker

pytestmark = pytest.mark.vllm


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


def reap(w: Any) -> set[str]:
    done: set[str] = set()
    w._reap_expired_send_leases(done)
    return done


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_lapsed_lease_is_not_revived(clock: dict[str, float], ours: bool) -> None:
    w = make_worker(ours)
    w._reqs_to_process.add("A")
    w._reqs_to_send["A"] = 1030.0
    clock["t"] = 1031.0  # past the deadline, reaper not run yet
    w._handle_heartbeat("A")
    if ours:
        assert reap(w) == {"A"}
        assert worker_stat(w, "lp_heartbeat_ids_late") == 1
        assert worker_stat(w, "lp_leases_renewed") == 0
    else:  # vLLM revives it: 1031 + 20
        assert w._reqs_to_send["A"] == 1051.0
        assert reap(w) == set()


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_reaper_frees_behind_a_renewed_head(clock: dict[str, float], ours: bool) -> None:
    w = make_worker(ours)
    w._reqs_to_process.update("ABC")
    w._reqs_to_send = {"A": 1030.0, "B": 1032.0, "C": 1034.0}
    for t in (1020.0, 1035.0 - 10, 1029.0):
        clock["t"] = t
        w._handle_heartbeat("A")  # before each deadline: renewed both ways
    assert w._reqs_to_send["A"] == 1049.0
    clock["t"] = 1040.0
    assert reap(w) == {"B", "C"}
    assert list(w._reqs_to_send) == ["A"]
    assert w._reqs_to_process == {"A"}
    assert len(w.xfer_stats.data["num_kv_expired_reqs"]) == 2


def test_reqs_to_send_is_a_view_of_the_table(clock: dict[str, float]) -> None:
    w = make_worker(True)
    w._reqs_to_process.add("r")
    w._reqs_to_send["r"] = 1012.0
    table = w._leases().table
    assert table.deadline("r") == 1012.0 and dict(w._reqs_to_send) == {"r": 1012.0}
    w._handle_heartbeat("r")
    assert table.deadline("r") == w._reqs_to_send["r"] == 1020.0


def _heartbeats(w: Any) -> list[bytes]:
    return [m for _, m in w.nixl_wrapper.sent if m.startswith(b"HB:")]


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_per_engine_turns(clock: dict[str, float], ours: bool) -> None:
    """vLLM's one global timer makes engine B, first seen 3 s after A's heartbeat,
    wait for A's next turn; ours heartbeats B at once."""
    s = make_scheduler(ours)
    s.on_new_request(d_request("d1", "p1", engine="A"))
    assert set(s.build_connector_meta(MagicMock()).heartbeat_by_engine) == {"A"}
    clock["t"] += 3.0
    s.on_new_request(d_request("d2", "p2", engine="B"))
    due = set(s.build_connector_meta(MagicMock()).heartbeat_by_engine)
    assert due == ({"B"} if ours else set())
    clock["t"] += 2.0
    due = s.build_connector_meta(MagicMock()).heartbeat_by_engine
    assert set(due) == ({"A"} if ours else {"A", "B"})
    assert due["A"].req_ids == {"p1"}


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_heartbeat_split_at_max_notification_bytes(ours: bool) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        HeartbeatInfo,
        NixlConnectorMetadata,
    )

    w = make_worker(
        ours, extra={"max_notification_bytes": 256}, agents={"P0": {(0, 0): "agent-p0"}}
    )
    ids = {f"cmpl-{i:04d}-0123abcd" for i in range(40)}  # 40 * 20 bytes
    meta = NixlConnectorMetadata()
    meta.heartbeat_by_engine = {"P0": HeartbeatInfo(req_ids=ids, host="h", port=1, tp_size=1)}
    w._send_heartbeats(meta)
    sent = _heartbeats(w)
    named = [i for m in sent for i in m[3:].decode().split(",")]
    assert sorted(named) == sorted(ids)
    if ours:
        assert len(sent) > 1 and max(map(len, sent)) <= 256
    else:
        assert len(sent) == 1 and len(sent[0]) > 256  # B5: a 256-byte transport drops it


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_pending_handshake_keeps_its_turn(ours: bool) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
        HeartbeatInfo,
        NixlConnectorMetadata,
    )

    w = make_worker(ours)
    w._pending.add("P0")
    meta = NixlConnectorMetadata()
    meta.heartbeat_by_engine = {"P0": HeartbeatInfo(req_ids={"p1"}, host="h", port=1, tp_size=1)}
    w._send_heartbeats(meta)
    assert _heartbeats(w) == []
    w._pending.clear()
    w._remote_agents["P0"] = {(0, 0): "agent-p0"}
    w._send_heartbeats(NixlConnectorMetadata())  # the next step: nothing new is due
    assert _heartbeats(w) == ([b"HB:p1"] if ours else [])


def test_late_read_is_told_apart_from_an_unknown_id(clock: dict[str, float]) -> None:
    w = make_worker(True)
    w._reqs_to_process.add("r")
    w._reqs_to_send["r"] = 1010.0
    clock["t"] = 1011.0
    assert reap(w) == {"r"}
    w.nixl_wrapper.deliver("d-agent", b"r:1", b"never-granted:1")
    assert w._get_new_notifs() == set()
    assert len(w.xfer_stats.data["num_notifications_after_expiry"]) == 2
    assert worker_stat(w, "lp_late_reads") == 1  # only r is known to have expired


@pytest.mark.parametrize("ours", [False, True], ids=["stock", "leaseproto"])
def test_malformed_notification(ours: bool) -> None:
    w = make_worker(ours)
    w.nixl_wrapper.deliver("d-agent", b"no-colon-here")
    if not ours:
        with pytest.raises(ValueError):
            w._get_new_notifs()  # vLLM's worker loop dies on it
        return
    assert w._get_new_notifs() == set()
    assert worker_stat(w, "lp_malformed") == 1


def test_readers_from_the_wire(clock: dict[str, float]) -> None:
    """vLLM's n: the lease ends after n transfer-dones, as vLLM frees after n."""
    w = make_worker(True)
    w._reqs_to_process.add("r")
    w._reqs_to_send["r"] = 1030.0
    w.nixl_wrapper.deliver("d0", b"r:2")
    assert w._get_new_notifs() == set() and "r" in w._reqs_to_send
    w.nixl_wrapper.deliver("d1", b"r:2")
    assert w._get_new_notifs() == {"r"}
    assert "r" not in w._reqs_to_send and "r" not in w._reqs_to_process


def test_early_transfer_done_settles_at_grant(clock: dict[str, float]) -> None:
    """D read before the worker registered the lease (async scheduling): the
    core stages the transfer-done and the grant frees at once (B7)."""
    w = make_worker(True)
    w._reqs_to_process.add("r")
    w.nixl_wrapper.deliver("d0", b"r:1")
    assert w._get_new_notifs() == set()
    w._reqs_to_send["r"] = 1030.0
    assert reap(w) == {"r"}
    assert "r" not in w._reqs_to_send and len(w.xfer_stats.data["num_kv_expired_reqs"]) == 0


@pytest.mark.parametrize("duration", [5, 1, 0, -6, "30", True])
def test_bad_lease_duration_stops_start_up(duration: object) -> None:
    cfg = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config={"kv_lease_duration": duration}
        )
    )
    for cls in (LeaseprotoConnectorScheduler, LeaseprotoConnectorWorker):
        with pytest.raises(ValueError, match="kv_lease_duration") as err:
            cls(cfg, "engine", MagicMock())
        assert "rule" in str(err.value)


def test_p_advertises_leaseproto(clock: dict[str, float]) -> None:
    from vllm.v1.request import RequestStatus

    s = make_finishing_scheduler(True, "P0", kv_lease_duration=12)
    req = SimpleNamespace(
        request_id="p1",
        status=RequestStatus.FINISHED_LENGTH_CAPPED,
        num_computed_tokens=32,
        kv_transfer_params={"do_remote_decode": True},
    )
    delay, params = s.request_finished(req, ([1, 2],))
    assert delay and params is not None
    assert params[PARAMS_KEY] == {
        "v": 1,
        "lease": {"kv_lease_duration": 12.0, "heartbeat_interval": 2.0, "lease_extension": 8.0},
    }
    assert s._reqs_need_send["p1"] == 1012.0


def _pair(clock: dict[str, float]) -> tuple[Any, Any]:
    """A P worker holding lease p1 and a D worker reading it; D advertised itself."""
    p = make_worker(True)
    d = make_worker(True, agents={"P0": {(0, 0): "p-agent"}})
    d._lp_set("_lp_advertised").add("d1")
    p._reqs_to_process.add("p1")
    p._reqs_to_send["p1"] = clock["t"] + 12
    d._hello("P0")
    ((agent, hello),) = d.nixl_wrapper.sent
    assert agent == "p-agent"
    p.nixl_wrapper.deliver("d-agent", hello)
    assert p._get_new_notifs() == set()
    assert p.nixl_wrapper.added == [d.nixl_wrapper.get_agent_metadata()]
    d._verifier().expect("d1", "p1", "p-agent", now=clock["t"])
    d._recving_transfers = {"d1": [7]}
    return p, d


def _carry(src: Any, dst: Any, agent: str) -> None:
    for _, msg in src.nixl_wrapper.sent:
        dst.nixl_wrapper.deliver(agent, msg)
    src.nixl_wrapper.sent.clear()


def test_verified_read_reported_after_ok(clock: dict[str, float]) -> None:
    p, d = _pair(clock)
    d.nixl_wrapper.sent.clear()
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())  # held
    p.nixl_wrapper.deliver("d-agent", b"p1:1")
    assert p._get_new_notifs() == {"p1"}
    assert p.nixl_wrapper.sent == [("d-agent", b"OK:p1")]
    _carry(p, d, "p-agent")
    assert d._get_new_notifs() == set()
    assert d._pop_done_transfers({}) == ({"d1"}, set())
    assert worker_stat(d, "lp_reads_verified") == 1


def test_verdict_polled_in_the_step_that_sees_the_read_complete(clock: dict[str, float]) -> None:
    """P answers while D's step waits (up to verdict_wait): the READ is reported in
    that step, as stock vLLM reports an unverified one, not in D's next step."""
    p, d = _pair(clock)
    d.nixl_wrapper.sent.clear()
    p.nixl_wrapper.deliver("d-agent", b"p1:1")  # the READ's transfer-done
    assert p._get_new_notifs() == {"p1"}
    _carry(p, d, "p-agent")  # P's OK is on its way: D's step sees it while it waits
    assert d._pop_done_transfers(d._recving_transfers) == ({"d1"}, set())
    assert worker_stat(d, "lp_reads_verified") == 1
    assert worker_stat(d, "lp_verdict_waits") == 1
    assert worker_stat(d, "lp_verdict_waits_missed") == 0


def test_verdict_wait_is_bounded_and_backs_off(clock: dict[str, float]) -> None:
    _, d = _pair(clock)
    t0 = time.monotonic()
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())  # no OK: held
    assert time.monotonic() - t0 < 1.0  # waited verdict_wait (10 ms), not the bound
    assert worker_stat(d, "lp_verdict_waits_missed") == 1
    d._verifier().expect("d2", "p2", "p-agent", now=clock["t"])
    d._recving_transfers = {"d2": [8]}
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())
    assert worker_stat(d, "lp_verdict_waits") == 1  # that P missed: no wait
    clock["t"] += d._leases().config.heartbeat_interval
    d._verifier().expect("d3", "p3", "p-agent", now=clock["t"])
    d._recving_transfers = {"d3": [9]}
    d._pop_done_transfers(d._recving_transfers)
    assert worker_stat(d, "lp_verdict_waits") == 2  # tried again an interval later


def test_no_verdict_wait_when_set_to_zero(clock: dict[str, float]) -> None:
    d = make_worker(True, extra={"verdict_wait": 0}, agents={"P0": {(0, 0): "p-agent"}})
    d._verifier().expect("d1", "p1", "p-agent", now=clock["t"])
    d.nixl_wrapper.deliver("p-agent", b"OK:p1")  # there to be read, but nothing polls it
    assert d._pop_done_transfers({"d1": [7]}) == (set(), set())
    assert worker_stat(d, "lp_verdict_waits") == 0
    d._get_new_notifs()  # the next step's poll
    assert d._pop_done_transfers({}) == ({"d1"}, set())


def test_a_wait_keeps_what_it_polled_for_the_step_after(clock: dict[str, float]) -> None:
    """D is also a grantor (bidirectional mode): a transfer-done for its own lease
    that the wait's poll handles is reported by the next step's poll."""
    _, d = _pair(clock)
    d._reqs_to_process.add("t1")
    d._reqs_to_send["t1"] = clock["t"] + 12
    d.nixl_wrapper.deliver("p-agent", b"t1:1")  # P read D's turn while D waits
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())
    assert d._get_new_notifs() == {"t1"}
    assert d._get_new_notifs() == set()


def test_a_poll_that_fails_during_the_wait_loses_nothing(
    clock: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NIXL raising in a wait's poll ends the wait; the READ stays held and what an
    earlier poll carried is still reported."""
    _, d = _pair(clock)
    d._reqs_to_process.add("t1")
    d._reqs_to_send["t1"] = clock["t"] + 12
    d.nixl_wrapper.deliver("p-agent", b"t1:1")
    real = d.nixl_wrapper.get_new_notifs
    polls = {"n": 0}

    def flaky() -> dict[str, list[bytes]]:
        polls["n"] += 1
        if polls["n"] > 1:
            raise RuntimeError("NIXL_ERR_BACKEND")
        return real()

    monkeypatch.setattr(d.nixl_wrapper, "get_new_notifs", flaky)
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())  # held, no raise
    assert worker_stat(d, "lp_verdict_waits_missed") == 1
    monkeypatch.setattr(d.nixl_wrapper, "get_new_notifs", real)
    d.nixl_wrapper.deliver("p-agent", b"OK:p1")
    assert d._get_new_notifs() == {"t1"}  # carried from the first poll
    assert d._pop_done_transfers({}) == ({"d1"}, set())


@pytest.mark.parametrize("value", [-1, 20, "soon"])
def test_a_bad_verdict_wait_stops_start_up(value: object) -> None:
    d = make_worker(True, extra={"verdict_wait": value})
    with pytest.raises(ValueError, match="verdict_wait"):
        d._verdict_waits()


def test_read_of_an_expired_lease_fails_and_recomputes(clock: dict[str, float]) -> None:
    p, d = _pair(clock)
    d.nixl_wrapper.sent.clear()
    clock["t"] += 13.0
    assert reap(p) == {"p1"}  # expired; D read the freed blocks
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())
    p.nixl_wrapper.deliver("d-agent", b"HB:p1", b"p1:1")
    p._get_new_notifs()
    assert p.nixl_wrapper.sent == [("d-agent", b"LL:expired:p1"), ("d-agent", b"NK:expired:p1")]
    _carry(p, d, "p-agent")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == ({"d1"}, {"d1"})  # failed: kv_load_failure_policy
    assert worker_stat(d, "lp_reads_refused") == 1


@pytest.mark.parametrize("advertised", [False, True], ids=["stock P", "leaseproto P"])
def test_hello_and_verification_only_toward_an_advertised_p(
    clock: dict[str, float], monkeypatch: pytest.MonkeyPatch, advertised: bool
) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
        NixlPullConnectorWorker,
    )

    issued: list[str] = []

    def post(self: Any, **kw: Any) -> bool:
        issued.append(kw["request_id"])
        return True

    monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks", post)
    d = make_reader(1, 0, 1)  # vLLM's _read_blocks_for_req picks the ranks
    if advertised:
        d._lp_set("_lp_advertised").add("d1")
    d._read_blocks_for_req("d1", recv_meta("d1", "p1"))
    d._read_blocks_for_req("d1", recv_meta("d1", "p1"))
    assert issued == ["d1", "d1"]
    d._recving_transfers = {"d1": [7]}
    done = d._pop_done_transfers(d._recving_transfers)
    if advertised:  # greeted once, then the READ is held for P's verdict
        assert [m[:13] for _, m in d.nixl_wrapper.sent] == [b"leaseproto/1,"]
        assert done == (set(), set())
    else:  # a stock P never receives bytes of ours; the READ is used unverified
        assert d.nixl_wrapper.sent == []
        assert done == ({"d1"}, set())


def test_a_request_whose_id_cannot_go_on_the_wire_is_not_tracked(clock: dict[str, float]) -> None:
    s = make_scheduler(True)
    s.on_new_request(d_request("d1", "p,1"))  # logged; the scheduler carries on
    s.on_new_request(d_request("d2", "p2"))
    assert s._heartbeat_req_engine == {"d2": ("P0", "p2")}
