"""Push mode in LeaseprotoPushConnector (issue 18, spec §2.8, I15/I16, B2, B9): D's
registration is a lease in D's table that P renews while the request waits for
prefill and its WRITE; D uses pushed KV only if the WRITE completed while the
registration was live; a lapsed registration is held until P completes or
aborts; P's abort releases D at once. vLLM's own push scheduler and worker code
runs (registration, matching by base id, ``_xfer_blocks_for_req``); only the
NIXL post of one WRITE is replaced, and vLLM's writer thread is driven one
turn at a time on the test's thread. A virtual clock. Needs vLLM."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_push_stubs import (
    D_ID,
    P_ID,
    ROUTER_ID,
    Pair,
    carry,
    d_request,
    make_pair,
    p_request,
    record_writes,
)
from vllm_stubs import virtual_clock, worker_stat

from leaseproto.integrations.vllm.push import PUSH_KIND
from leaseproto.integrations.vllm.tracking import PARAMS_KEY

pytestmark = pytest.mark.vllm

TTL = 24.0  # push_registration_timeout
EXT = 8.0  # lease_extension of kv_lease_duration 12


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    return record_writes(monkeypatch)


def _exchange(pair: Pair) -> None:
    """Every notification either side sent, delivered to the other."""
    carry(pair.d, pair.p)
    carry(pair.p, pair.d)


def _registered(clock: dict[str, float], **kw: Any) -> Pair:
    """P and D both have the request; D registered its blocks with P."""
    pair = make_pair(clock, **kw)
    pair.p_admits(p_request())
    pair.d_admits(d_request())
    pair.d_step()  # the registration leaves D (and is granted a lease there)
    carry(pair.d, pair.p)
    pair.p_step()  # P takes it
    return pair


def _steps(pair: Pair, seconds: float, *, p_runs: bool = True) -> tuple[set[str], set[str]]:
    """Both engines step once a second for ``seconds`` (P only if ``p_runs``);
    what D reported (finished_recving, failed_recving) meanwhile."""
    done: set[str] = set()
    failed: set[str] = set()
    end = pair.clock["t"] + seconds
    while pair.clock["t"] < end:
        pair.clock["t"] += 1.0
        if p_runs:
            pair.p_step()
        _exchange(pair)
        d_done, d_failed = pair.d_step()
        done |= d_done
        failed |= d_failed
        _exchange(pair)
    return done, failed


def test_d_advertises_in_its_registration_and_leaves_the_watchdog(clock: dict[str, float]) -> None:
    pair = make_pair(clock)
    pair.d_admits(d_request())
    reg = pair.d_sched._push_pending_registrations[D_ID]
    assert reg[PARAMS_KEY]["kind"] == PUSH_KIND
    assert reg[PARAMS_KEY]["lease"]["kv_lease_duration"] == TTL
    pair.d_step()
    assert D_ID not in pair.d_sched._push_registration_deadlines  # the lease holds it now
    assert pair.d._reqs_to_send[D_ID] == pytest.approx(clock["t"] + TTL)
    stock = make_pair(clock, d_ours=False)
    stock.d_admits(d_request())
    assert PARAMS_KEY not in stock.d_sched._push_pending_registrations[D_ID]


def test_a_live_write_is_used_and_p_frees_its_blocks(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    pair = _registered(clock)
    pair.p_prefill_done(p_request())
    freed = pair.p_step()  # P's blocks matched with D's registration: the WRITE goes
    assert [w["remote_request_id"] for w in writes] == [D_ID]
    assert P_ID in freed  # the WRITE completed (NIXL says DONE at once here)
    carry(pair.p, pair.d)
    done, failed = pair.d_step()
    assert (done, failed) == ({D_ID}, set())
    assert (b"OK:" + D_ID.encode()) in [m for _, m in pair.d.nixl_wrapper.sent]
    assert worker_stat(pair.d, "lp_push_writes_verified") == 1
    assert worker_stat(pair.p, "lp_push_writes_done") == 1
    assert D_ID not in pair.d._reqs_to_send  # the registration lease ended TRANSFERRED


def _sent(w: Any) -> list[bytes]:
    return [m for _, m in w.nixl_wrapper.sent]


def test_p_renews_the_registration_while_prefill_waits(clock: dict[str, float]) -> None:
    """I16 mirrored: while P holds the request (an overloaded P: no prefill yet),
    its heartbeats keep D's registration past push_registration_timeout; once P
    is silent, the registration lapses by its last heartbeat + lease_extension."""
    pair = _registered(clock)
    start = clock["t"]
    for _ in range(int(TTL) + 6):
        done, failed = _steps(pair, 1.0)
        assert D_ID in pair.d._reqs_to_send, clock["t"] - start
        assert (done, failed) == (set(), set())
    assert worker_stat(pair.d, "lp_leases_renewed") >= TTL // 2
    last = clock["t"]
    while D_ID in pair.d._reqs_to_send:  # P stops: no heartbeats
        _steps(pair, 1.0, p_runs=False)
    assert clock["t"] - last <= EXT + 1.0


def _lapsed(clock: dict[str, float]) -> Pair:
    """P renewed the registration once, then stalled past its lease: D holds it."""
    pair = _registered(clock)
    _steps(pair, 1.0)  # P's capability and first heartbeat reach D
    done, failed = _steps(pair, EXT + TTL, p_runs=False)
    assert D_ID not in pair.d._reqs_to_send  # the lease has lapsed...
    assert (done, failed) == (set(), set())  # ...but D holds the blocks: P may be writing
    assert worker_stat(pair.d, "lp_push_quarantined") == 1
    return pair


def test_a_write_completed_after_the_registration_lapsed_is_not_used(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    """I15: P stalls past D's registration lease, then its prefill ends and its
    WRITE goes (before P hears of the lapse). D's table handles the completion
    after the lease ended: NK to P, the receive fails (vLLM recomputes), the
    pushed KV is never used. Stock vLLM's D uses it (see the next test)."""
    pair = _lapsed(clock)
    pair.p_prefill_done(p_request())
    pair.p_step()
    assert len(writes) == 1
    carry(pair.p, pair.d)
    done, failed = pair.d_step()
    assert failed == {D_ID} and D_ID in done  # reported failed: recomputed, not used
    assert b"NK:expired:" + D_ID.encode() in _sent(pair.d)
    assert worker_stat(pair.d, "lp_push_writes_verified") == 0
    carry(pair.d, pair.p)
    pair.p_step()
    assert worker_stat(pair.p, "lp_push_writes_refused") == 1


def test_stock_d_uses_a_write_after_its_watchdog(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    """The defect above, on stock vLLM: the watchdog only drops the registration,
    and a WRITE that lands after it is used as if it were on time."""
    pair = make_pair(clock, d_ours=False, p_ours=False)
    pair.p_admits(p_request())
    pair.d_admits(d_request())
    pair.d_step()
    carry(pair.d, pair.p)
    pair.p_step()
    _steps(pair, TTL + EXT + 1.0, p_runs=False)
    pair.p_prefill_done(p_request())
    pair.p_step()
    carry(pair.p, pair.d)
    assert pair.d_step() == ({D_ID}, set())


def test_a_lapsed_registration_is_released_when_p_gives_it_up(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    """P resumes without having written: its next heartbeat gets LL:expired, P
    gives the registration up (no WRITE of it will go) and says AB:, which ends
    D's quarantine at once. A later prefill of the request writes nothing."""
    pair = _lapsed(clock)
    pair.p_step()  # heartbeat
    carry(pair.p, pair.d)
    assert pair.d_step() == (set(), set())
    assert b"LL:expired:" + D_ID.encode() in _sent(pair.d)
    carry(pair.d, pair.p)
    pair.p_step()  # LL: P gives up, AB: to D
    assert b"AB:" + D_ID.encode() in _sent(pair.p)
    carry(pair.p, pair.d)
    _done, failed = pair.d_step()
    assert failed == {D_ID}
    pair.p_prefill_done(p_request())
    pair.p_step()
    assert writes == []  # given up: never written


def test_a_lapsed_registration_is_released_when_p_is_forgotten(clock: dict[str, float]) -> None:
    pair = _lapsed(clock)
    assert _steps(pair, 5.0, p_runs=False) == (set(), set())
    del pair.d._remote_agents["P0"]  # vLLM evicted the engine (or it was replaced)
    _done, failed = pair.d_step()
    assert failed == {D_ID}


def test_a_quarantine_ends_after_its_stale_bound(clock: dict[str, float]) -> None:
    """Nothing waits forever: a P that stays connected and silent is given up
    max(10 kv_lease_duration, max_lease_lifetime) = 120 s after the lapse."""
    pair = _registered(clock)
    _steps(pair, 1.0)
    lapsed = None
    failed: set[str] = set()
    while not failed and clock["t"] < 1000.0 + 200.0:
        _, failed = _steps(pair, 1.0, p_runs=False)
        if lapsed is None and D_ID not in pair.d._reqs_to_send:
            lapsed = clock["t"]
    assert lapsed is not None and 120.0 <= clock["t"] - lapsed <= 121.0


@pytest.mark.parametrize("ours", [True, False])
def test_b9_an_abort_on_p_releases_d_at_once(clock: dict[str, float], ours: bool) -> None:
    """B9: P aborts the request before its prefill (its request_finished with an
    abort status). Our P gives D's registration up (AB:), D fails the receive
    at once (recomputed). Stock vLLM: nothing reaches D; its watchdog drops the
    registration at push_registration_timeout and the request waits forever."""
    from vllm.v1.request import RequestStatus

    pair = _registered(clock, d_ours=ours, p_ours=ours)
    _steps(pair, 1.0)
    request = p_request()
    request.status = RequestStatus.FINISHED_ABORTED
    pair.p_sched.request_finished(request, ([],))
    done, failed = _steps(pair, 2.0)
    if ours:
        assert failed == {D_ID}
        assert worker_stat(pair.p, "lp_push_aborts_sent") == 1
        return
    done, failed = _steps(pair, 3 * TTL)
    assert (done, failed) == (set(), set())  # stock: still waiting (B9)


@pytest.mark.parametrize("ours", [True, False])
def test_b2_heartbeats_renew_ps_lease(clock: dict[str, float], ours: bool) -> None:
    """B2: D's heartbeats for P's lease name D's own id (ours) or the router's
    (vLLM's), never P's. Our P maps either to its lease by base id, so the lease
    outlives kv_lease_duration while D waits; stock vLLM's P never matches them
    and frees the blocks at kv_lease_duration."""
    pair = make_pair(clock, d_ours=ours, p_ours=ours)
    pair.p_admits(p_request())
    pair.p_prefill_done(p_request())  # P's lease: no registration yet (D is slow)
    pair.p_step()
    assert P_ID in pair.p._reqs_to_send
    pair.d_sched.on_new_request(d_request())  # D's queue: it heartbeats P, registers nothing
    sent_id = D_ID if ours else ROUTER_ID
    for _ in range(20):
        clock["t"] += 1.0
        freed = pair.p_step()
        pair.d.start_load_kv(pair.d_sched.build_connector_meta(None))
        assert all(m == b"HB:" + sent_id.encode() for m in _sent(pair.d))
        carry(pair.d, pair.p)
        if not ours:
            if P_ID in freed:
                break
            continue
        assert P_ID not in freed
    if ours:
        assert P_ID in pair.p._reqs_to_send
        assert worker_stat(pair.p, "lp_leases_renewed") >= 8
    else:
        assert clock["t"] - 1000.0 <= 13.0  # freed at kv_lease_duration, D still waiting


def test_our_p_matches_the_routers_id_too(clock: dict[str, float]) -> None:
    """A stock D's heartbeat names the router's id: our P renews its lease by it."""
    pair = make_pair(clock, d_ours=False)
    pair.p_admits(p_request())
    pair.p_prefill_done(p_request())
    pair.p_step()
    before = pair.p._reqs_to_send[P_ID]
    clock["t"] += 6.0
    pair.p.nixl_wrapper.deliver("d0", b"HB:" + ROUTER_ID.encode())
    pair.p_step()
    after = pair.p._reqs_to_send[P_ID]
    assert after == pytest.approx(clock["t"] + EXT) and after > before


def test_a_stock_p_ends_registrations_at_the_watchdog(
    clock: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    """Our D, stock P (it never heartbeats D, never says leaseproto/1): the
    registration is the one-shot watchdog of push_registration_timeout, and at
    its end the receive fails (recomputed) instead of waiting forever; said once."""
    caplog.set_level(logging.WARNING, logger="vllm.leaseproto.worker")
    pair = _registered(clock, p_ours=False)
    _done, failed = _steps(pair, TTL - 1.0)
    assert failed == set()
    _done, failed = _steps(pair, 2.0)
    assert failed == {D_ID}
    said = [r for r in caplog.records if "did not say leaseproto/1" in r.getMessage()]
    assert len(said) == 1
    assert not any(m.startswith((b"LL:", b"AB:", b"OK:", b"NK:")) for m in _sent(pair.d))


def test_a_stock_p_write_while_the_registration_is_live_is_used(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    pair = _registered(clock, p_ours=False)
    pair.p_prefill_done(p_request())
    pair.p_step()
    carry(pair.p, pair.d)
    assert pair.d_step() == ({D_ID}, set())
    assert not any(m.startswith((b"OK:", b"NK:")) for m in _sent(pair.d))  # a stock P: nothing


def test_a_stock_d_gets_nothing_of_ours(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    """Our P, stock D (its registration advertises nothing): P heartbeats it not,
    sends it no capability, verdict or abort; the WRITE goes as vLLM's does."""
    pair = _registered(clock, d_ours=False)
    _steps(pair, 3.0)
    assert _sent(pair.p) == []
    pair.p_prefill_done(p_request())
    pair.p_step()
    assert [w["remote_request_id"] for w in writes] == [D_ID]
    assert not any(m.startswith((b"HB:", b"AB:", b"LL:")) for m in _sent(pair.p))
    carry(pair.p, pair.d)
    assert pair.d_step() == ({D_ID}, set())


@pytest.mark.parametrize("ours", [True, False])
def test_p_keeps_its_blocks_while_its_write_runs(
    clock: dict[str, float], writes: list[dict[str, Any]], ours: bool
) -> None:
    """P's lease expires (no heartbeat from D) while its WRITE is still reading
    the blocks: our P frees them when the WRITE is over; stock vLLM frees them
    at the expiry, under the running WRITE."""
    pair = _registered(clock, d_ours=ours, p_ours=ours)
    state = {"s": "PROC"}
    pair.p.nixl_wrapper.check_xfer_state = lambda handle: state["s"]
    pair.p_prefill_done(p_request())
    assert pair.p_step() == set()
    assert len(writes) == 1
    clock["t"] += 13.0  # past kv_lease_duration 12: the lease expires
    freed = pair.p_step()
    assert (P_ID in freed) is not ours
    if ours:
        state["s"] = "DONE"
        clock["t"] += 1.0
        assert P_ID in pair.p_step()


def test_an_abort_on_d_ends_the_registration_and_p_writes_nothing(
    clock: dict[str, float], writes: list[dict[str, Any]]
) -> None:
    """D's request ends while its registration waits (the client left): vLLM
    keeps D's blocks until the receive is reported. The registration ends at
    once; P hears LL:aborted at its next heartbeat, gives it up (AB:), and D
    reports the receive (failed), so vLLM frees the blocks; P never writes.
    Stock vLLM holds D's blocks until P's WRITE lands."""
    from vllm.v1.request import RequestStatus

    pair = _registered(clock)
    _steps(pair, 1.0)
    request = pair.requests[D_ID]
    request.status = RequestStatus.FINISHED_ABORTED
    pair.d_sched.request_finished(request, ([3, 4],))
    _done, failed = _steps(pair, 3.0)
    assert failed == {D_ID}
    assert worker_stat(pair.p, "lp_push_lease_lost") == 1
    pair.p_prefill_done(p_request())
    pair.p_step()
    assert writes == []
