"""Who may say what, in LeaseprotoConnector (issue 17): verdicts from every P rank
read, for every TP ratio; verdicts and acts from other agents ignored; P
forgets silent decoders; peer-triggered log lines rate-limited. On vLLM's own
classes: vLLM's ``_read_blocks_for_req`` and ``compute_tp_mapping`` choose the
ranks each D rank reads; only the NIXL post (``_read_blocks``) is replaced.
A virtual clock. Needs vLLM."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_stubs import (
    make_reader,
    make_worker,
    record_reads,
    recv_meta,
    virtual_clock,
    worker_stat,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return record_reads(monkeypatch)


def _prefill(rank: int, clock: dict[str, float]) -> Any:
    """P rank ``rank`` (ours) holding lease p1."""
    p = make_worker(True, name=f"p{rank}")
    p._reqs_to_process.add("p1")
    p._reqs_to_send["p1"] = clock["t"] + 12
    return p


def _carry(src: Any, dst: Any, *, to: str) -> None:
    """Deliver what ``src`` sent to agent ``to`` to worker ``dst``."""
    keep = []
    for agent, msg in src.nixl_wrapper.sent:
        if agent == to:
            dst.nixl_wrapper.deliver(src.nixl_wrapper.name, msg)
        else:
            keep.append((agent, msg))
    src.nixl_wrapper.sent = keep


def _read(d: Any, p_tp: int, posted: list[dict[str, Any]], local: str = "d1") -> list[str]:
    """D reads p1 as vLLM does; returns the P agents vLLM read."""
    d._lp_set("_lp_advertised").add(local)
    before = len(posted)
    d._read_blocks_for_req(local, recv_meta(local, "p1", p_tp=p_tp))
    d._recving_transfers[local] = [7]
    return [c["agent"] for c in posted[before:]]


def _transfer_done(d: Any, p: Any, call: dict[str, Any]) -> set[str]:
    """What the READ's notification does at P: hello first, then ``<id>:<n>``."""
    _carry(d, p, to=p.nixl_wrapper.name)
    p.nixl_wrapper.deliver(
        d.nixl_wrapper.name, f"{call['remote_request_id']}:{call['expected_consumers']}".encode()
    )
    done: set[str] = p._get_new_notifs()
    return done


# -- every rank's verdict -----------------------------------------------------------------
def test_p_tp_above_d_tp_needs_ok_from_every_rank(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """P TP 2, D TP 1: D's one rank reads both P ranks; P1's lease has expired.
    P0's OK alone must not let D use the read (today: settled by the first)."""
    d = make_reader(1, 0, 2, name="d0")
    ps = [_prefill(0, clock), _prefill(1, clock)]
    assert _read(d, 2, posted) == ["p0", "p1"]
    assert d._pop_done_transfers(d._recving_transfers) == (set(), set())  # held
    clock["t"] += 13.0
    ps[0]._reqs_to_send["p1"] = clock["t"] + 12  # P0 renewed; P1 was not
    assert ps[1]._reap_expired_send_leases(set()) is None
    _transfer_done(d, ps[0], posted[0])
    _carry(ps[0], d, to="d0")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == (set(), set())  # OK from p0 only: still held
    _transfer_done(d, ps[1], posted[1])
    assert ps[1].nixl_wrapper.sent == [("d0", b"NK:expired:p1")]
    _carry(ps[1], d, to="d0")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == ({"d1"}, {"d1"})  # failed: recomputed
    assert worker_stat(d, "lp_reads_refused") == 1 and worker_stat(d, "lp_reads_verified") == 0


def test_p_tp_above_d_tp_uses_the_read_after_every_ok(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    d = make_reader(1, 0, 4, name="d0")
    ps = [_prefill(r, clock) for r in range(4)]
    assert _read(d, 4, posted) == ["p0", "p1", "p2", "p3"]
    d._pop_done_transfers(d._recving_transfers)
    for r, p in enumerate(ps):
        assert _transfer_done(d, p, posted[r]) == {"p1"}
        _carry(p, d, to="d0")
        d._get_new_notifs()
        expect = ({"d1"}, set()) if r == 3 else (set(), set())
        assert d._pop_done_transfers({}) == expect
    assert worker_stat(d, "lp_reads_verified") == 1


def test_d_tp_above_p_tp_each_reader_gets_its_own_verdict(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """D TP 2, P TP 1: both D ranks read P0 (n = 2). A third agent's forged
    transfer-done between theirs is ignored, so the second reader still gets OK
    (today it completes the lease and D1's read is refused)."""
    ds = [make_reader(2, r, 1, name=f"d{r}") for r in range(2)]
    p = _prefill(0, clock)
    for d in ds:  # both ranks heartbeat P0 as soon as the scheduler tracks the request
        p.nixl_wrapper.deliver(d.nixl_wrapper.name, b"HB:p1")
    p._get_new_notifs()
    for d in ds:
        assert _read(d, 1, posted) == ["p0"]
        d._pop_done_transfers(d._recving_transfers)
    assert [c["expected_consumers"] for c in posted] == [2, 2]
    assert _transfer_done(ds[0], p, posted[0]) == set()  # 1 of 2 readers
    p.nixl_wrapper.deliver("x", b"p1:2")  # a third agent that pushed its metadata
    assert p._get_new_notifs() == set()
    assert worker_stat(p, "lp_foreign_acts") == 1
    assert _transfer_done(ds[1], p, posted[1]) == {"p1"}
    for d in ds:
        _carry(p, d, to=d.nixl_wrapper.name)
        d._get_new_notifs()
        assert d._pop_done_transfers({}) == ({"d1"}, set())
        assert worker_stat(d, "lp_reads_verified") == 1


def test_equal_tp_an_ok_from_a_rank_not_read_is_ignored(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """D TP 2 = P TP 2: D rank 1 reads P rank 1 only; P rank 0's OK (it can
    notify D too) does not settle the read (today it does)."""
    d = make_reader(2, 1, 2, name="d1")
    assert _read(d, 2, posted) == ["p1"]
    d._pop_done_transfers(d._recving_transfers)
    d.nixl_wrapper.deliver("p0", b"OK:p1")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == (set(), set())
    assert worker_stat(d, "lp_foreign_verdicts") == 1
    d.nixl_wrapper.deliver("p1", b"OK:p1")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == ({"d1"}, set())


@pytest.mark.parametrize("msg", [b"OK:p1", b"NK:expired:p1", b"LL:expired:p1"])
def test_a_verdict_from_a_stranger_is_ignored(
    clock: dict[str, float], posted: list[dict[str, Any]], msg: bytes
) -> None:
    d = make_reader(1, 0, 1, name="d0")
    _read(d, 1, posted)
    d._pop_done_transfers(d._recving_transfers)
    d.nixl_wrapper.deliver("x", msg)
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == (set(), set())  # neither used nor refused
    assert worker_stat(d, "lp_foreign_verdicts") == 1
    d.nixl_wrapper.deliver("p0", b"OK:p1")
    d._get_new_notifs()
    assert d._pop_done_transfers({}) == ({"d1"}, set())


def test_verdicts_naming_no_read_are_not_kept(clock: dict[str, float]) -> None:
    d = make_worker(True, name="d0")
    for i in range(1000):
        d.nixl_wrapper.deliver("x", f"OK:forged-{i}".encode())
    d._get_new_notifs()
    assert not d._verifier().__dict__.get("_verdicts")  # today: 1000 entries, never dropped
    assert len(d._verifier()) == 0 and worker_stat(d, "lp_unmatched_verdicts") == 1000


# -- leases bound to their reader ---------------------------------------------------------
def test_a_forged_renewal_from_another_agent_is_ignored(clock: dict[str, float]) -> None:
    """D heartbeats its lease for one interval and dies; a third agent then keeps
    heartbeating it. The lease ends at D's last renewal + E (today the forger
    keeps it alive)."""
    p = _prefill(0, clock)
    start = clock["t"]
    for _ in range(2):  # H = 5 s, E = 20 s
        p.nixl_wrapper.deliver("d0", b"HB:p1")
        p._get_new_notifs()
        clock["t"] += 5.0
    assert p._reqs_to_send["p1"] == start + 25  # D's last renewal: start + 5 + E
    freed: set[str] = set()
    while clock["t"] < start + 60 and not freed:
        clock["t"] += 2.0
        p.nixl_wrapper.deliver("x", b"HB:p1")
        p._get_new_notifs()
        p._reap_expired_send_leases(freed)
    assert freed == {"p1"} and clock["t"] == start + 26
    assert worker_stat(p, "lp_foreign_acts") == 8


def test_a_forged_abort_and_transfer_done_leave_the_lease_alone(clock: dict[str, float]) -> None:
    p = _prefill(0, clock)
    p.nixl_wrapper.deliver("d0", b"HB:p1")
    p._get_new_notifs()
    p.nixl_wrapper.deliver("x", b"AB:p1", b"p1:1")
    assert p._get_new_notifs() == set()
    assert "p1" in p._reqs_to_send and worker_stat(p, "lp_foreign_acts") == 2
    p.nixl_wrapper.deliver("d0", b"p1:1")
    assert p._get_new_notifs() == {"p1"}


def test_stock_d_still_works(clock: dict[str, float]) -> None:
    """A stock vLLM D (no hello): its first transfer-done binds and ends the lease."""
    p = _prefill(0, clock)
    p.nixl_wrapper.deliver("stock-d", b"p1:1")
    assert p._get_new_notifs() == {"p1"} and p.nixl_wrapper.sent == []


# -- P forgets silent decoders ------------------------------------------------------------
def test_silent_decoders_are_forgotten_and_greet_again(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    d = make_reader(1, 0, 1, name="d0")
    p = _prefill(0, clock)
    ttl = p._leases().config.tombstone_ttl
    _read(d, 1, posted)
    assert _transfer_done(d, p, posted[0]) == {"p1"}  # hello loaded d0, lease done
    assert p.nixl_wrapper.added == [b"meta:d0"]
    assert p.nixl_wrapper.sent == [("d0", b"OK:p1")]
    p.nixl_wrapper.sent.clear()
    clock["t"] += ttl - 1
    p._reap_expired_send_leases(set())
    assert p.nixl_wrapper.removed == []
    clock["t"] += 2
    p._reap_expired_send_leases(set())
    assert p.nixl_wrapper.removed == ["d0"]  # today: never removed
    assert worker_stat(p, "lp_decoders_forgotten") == 1
    # D comes back after the silence: it greets again before its READ
    d.nixl_wrapper.sent.clear()
    p._reqs_to_process.add("p2")
    p._reqs_to_send["p2"] = clock["t"] + 12
    d._lp_set("_lp_advertised").add("d2")
    d._read_blocks_for_req("d2", recv_meta("d2", "p2"))
    assert [m[:13] for _, m in d.nixl_wrapper.sent] == [b"leaseproto/1,"]
    _carry(d, p, to="p0")
    p.nixl_wrapper.deliver("d0", b"p2:1")
    assert p._get_new_notifs() == {"p2"}
    assert p.nixl_wrapper.added == [b"meta:d0", b"meta:d0"]
    assert p.nixl_wrapper.sent == [("d0", b"OK:p2")]


def test_a_hello_carrying_another_agents_metadata_is_refused(clock: dict[str, float]) -> None:
    p = _prefill(0, clock)
    p.nixl_wrapper.deliver("x", b"leaseproto/1,hello,meta:d0")
    p._get_new_notifs()
    assert p.nixl_wrapper.removed == ["d0"] and worker_stat(p, "lp_malformed") == 1
    p.nixl_wrapper.deliver("x", b"p1:1")
    p._get_new_notifs()
    assert p.nixl_wrapper.sent == []  # x never became a verdict reader


def test_a_hello_naming_another_agent_in_nixl_metadata_loads_nothing(
    clock: dict[str, float],
) -> None:
    """Read from NIXL's layout, the name is checked before loading: another agent's
    metadata is neither loaded nor removed (the agent it names may be a reader P holds;
    the check after loading removed it)."""
    p = _prefill(0, clock)
    other = b"nixlSerDes|Agent" + struct.pack("<Q", 2) + b"d0|Conns"
    p.nixl_wrapper.deliver("x", b"leaseproto/1,hello," + other)
    p._get_new_notifs()
    assert getattr(p.nixl_wrapper, "added", []) == [] and p.nixl_wrapper.removed == []
    assert worker_stat(p, "lp_malformed") == 1


# -- rate-limited log lines ---------------------------------------------------------------
def test_malformed_notifications_are_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = make_worker(True)
    for i in range(200):
        p.nixl_wrapper.deliver("x", f"junk-{i}".encode(), f"p{i}:1".encode())
    with caplog.at_level(logging.WARNING, logger="vllm.leaseproto.worker"):
        p._get_new_notifs()
    assert worker_stat(p, "lp_malformed") == 200
    assert len(caplog.records) <= 4, [r.getMessage() for r in caplog.records]


def test_advertisements_are_dropped_once_used(
    clock: dict[str, float], posted: list[dict[str, Any]]
) -> None:
    """D keeps a request's advertisement only until its READ is posted (today:
    forever), but across a pending handshake, after which vLLM calls again."""
    d = make_reader(1, 0, 1, name="d0")
    agents = d._remote_agents.pop("P0")
    d._background_nixl_handshake = lambda *a: None  # vLLM queues it for after the handshake
    _read(d, 1, posted)
    assert posted == [] and "d1" in d._lp_set("_lp_advertised")
    d._remote_agents["P0"] = agents
    d._read_blocks_for_req("d1", recv_meta("d1", "p1"))
    assert [c["agent"] for c in posted] == ["p0"]
    assert "d1" not in d._lp_set("_lp_advertised")
    assert d._verifier().missing("d1") == {"p0"}  # the READ is verified all the same
