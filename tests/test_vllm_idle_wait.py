"""P's engine steps with nothing to compute poll for notifications (``idle_wait``,
:mod:`leaseproto.integrations.vllm.idle`) instead of returning at once."""

from __future__ import annotations

import math
import time
from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import NixlBaseConnectorWorker
from vllm_stubs import make_scheduler, make_worker, virtual_clock, worker_stat

from leaseproto.integrations.vllm import idle
from leaseproto.integrations.vllm.idle import IDLE_ATTR, idle_wait, poll_until

pytestmark = pytest.mark.vllm


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    return virtual_clock(monkeypatch)


class Sleeps:
    """``time.sleep`` on the virtual clock: each sleep advances it, and may deliver
    what ``then`` holds to a worker first (a notification arriving mid-wait)."""

    def __init__(self, clock: dict[str, float]) -> None:
        self.clock = clock
        self.slept: list[float] = []
        self.then: list[tuple[Any, str, bytes]] = []

    def __call__(self, s: float) -> None:
        self.slept.append(s)
        self.clock["t"] += s
        for worker, agent, msg in self.then:
            worker.nixl_wrapper.deliver(agent, msg)
        self.then.clear()


@pytest.fixture
def sleeps(clock: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> Sleeps:
    s = Sleeps(clock)
    monkeypatch.setattr(time, "sleep", s)
    return s


def _holding_p(clock: dict[str, float], **extra: Any) -> Any:
    """A P worker holding lease p1 (vLLM's ``_reqs_to_send`` is the table's view)."""
    p = make_worker(True, kv_lease_duration=12, extra=extra or None, name="p-agent")
    p._recving_transfers = {}
    p._reqs_to_process.add("p1")
    p._reqs_to_send["p1"] = clock["t"] + 12
    assert len(p._leases().table) == 1
    d = make_worker(True, agents={"P0": {(0, 0): "p-agent"}})  # D says it understands us
    d._hello("P0")
    ((_, hello),) = d.nixl_wrapper.sent
    p.nixl_wrapper.deliver("d-agent", hello)
    assert p._get_new_notifs() == set()
    return p


def _count_polls(w: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    polls = [0]
    real = w.nixl_wrapper.get_new_notifs

    def counted() -> dict[str, list[bytes]]:
        polls[0] += 1
        return real()

    monkeypatch.setattr(w.nixl_wrapper, "get_new_notifs", counted)
    return polls


# -- the setting ------------------------------------------------------------------------------
def test_idle_wait_defaults_and_bounds() -> None:
    assert idle_wait(None, 2.0) == idle.DEFAULT_IDLE_WAIT == 0.01
    assert idle_wait({"idle_wait": 0}, 2.0) == 0.0
    assert idle_wait({"idle_wait": 0.5}, 2.0) == 0.5
    for bad in (-0.001, 2.0, math.nan, math.inf, True, "0.01", None):
        with pytest.raises(ValueError, match=r"idle_wait=.* below the heartbeat interval"):
            idle_wait({"idle_wait": bad}, 2.0)


def test_a_bad_idle_wait_stops_the_worker_at_start_up(clock: dict[str, float]) -> None:
    w = make_worker(True, kv_lease_duration=12, extra={"idle_wait": 3})  # interval: 2 s
    with pytest.raises(ValueError, match="idle_wait=3"):
        w._idle_wait_s()


# -- the loop ---------------------------------------------------------------------------------
def test_poll_until_stops_at_the_first_true_poll(sleeps: Sleeps, clock: dict[str, float]) -> None:
    answers = iter([False, False, True, False])
    assert poll_until(lambda: next(answers), lambda: clock["t"], clock["t"] + 1.0) == 3
    assert sleeps.slept == [idle.IDLE_POLL_S] * 2


def test_poll_until_stops_at_until_and_never_sleeps_past_it(
    sleeps: Sleeps, clock: dict[str, float]
) -> None:
    start = clock["t"]
    polls = poll_until(lambda: False, lambda: clock["t"], start + 0.0025)
    assert polls == 4 and clock["t"] == pytest.approx(start + 0.0025)
    assert sleeps.slept == pytest.approx([0.001, 0.001, 0.0005])


def test_poll_until_is_bounded_when_the_clock_stands_still(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "sleep", lambda s: None)
    assert poll_until(lambda: False, lambda: 0.0, 0.01) == 12  # 10 periods, and two
    assert poll_until(lambda: False, lambda: 0.0, -1.0) == 1  # past already: one poll


# -- the worker -------------------------------------------------------------------------------
def test_an_idle_step_answers_a_transfer_done_as_it_arrives(
    clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transfer-done arrives while P's idle step waits: P answers OK at once and
    ends the step, which reports the request done sending (its blocks are freed)."""
    p = _holding_p(clock)
    polls = _count_polls(p, monkeypatch)
    sleeps.then.append((p, "d-agent", b"p1:1"))  # arrives during the first sleep
    p._wait_while_idle()
    assert polls[0] == 2 and sleeps.slept == [idle.IDLE_POLL_S]
    assert p.nixl_wrapper.sent == [("d-agent", b"OK:p1")]
    assert worker_stat(p, "lp_idle_waits") == 1
    assert p._get_new_notifs() == {"p1"}  # the step's own poll reports it
    assert "p1" not in p._leases().table


def test_an_idle_step_without_news_waits_idle_wait_and_no_more(
    clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _holding_p(clock, idle_wait=0.005)
    polls = _count_polls(p, monkeypatch)
    start = clock["t"]
    p._wait_while_idle()
    assert clock["t"] - start == pytest.approx(0.005)
    assert polls[0] == 6 and p.nixl_wrapper.sent == []
    assert p._get_new_notifs() == set()


def test_an_idle_wait_ends_at_the_earliest_lease_deadline(
    clock: dict[str, float], sleeps: Sleeps
) -> None:
    """A lease that comes due during the wait is released by this step's reap, not
    idle_wait later."""
    p = _holding_p(clock, idle_wait=0.5)
    deadline = p._leases().table.next_deadline()
    clock["t"] = deadline - 0.0015
    p._wait_while_idle()
    assert clock["t"] == pytest.approx(deadline)
    done: set[str] = set()
    p._reap_expired_send_leases(done)
    assert done == {"p1"}


@pytest.mark.parametrize(
    "why", ["idle_wait 0", "no lease held", "a READ in flight", "a read being set up"]
)
def test_no_idle_wait(
    why: str, clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing held, or this engine reading itself (P's turn-2 read of
    bidirectional mode): the step returns at once, as vLLM's does."""
    p = _holding_p(clock, **({"idle_wait": 0} if why == "idle_wait 0" else {}))
    if why == "no lease held":
        p._leases().table.abort("p1", now=p._leases().now())
    elif why == "a READ in flight":
        p._recving_transfers = {"t2": [3]}
    elif why == "a read being set up":
        p._recving_metadata = {"t2": object()}
    polls = _count_polls(p, monkeypatch)
    p._wait_while_idle()
    assert polls[0] == 0 and sleeps.slept == [] and worker_stat(p, "lp_idle_waits") == 0


def test_a_poll_that_fails_ends_the_wait_and_loses_nothing(
    clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NIXL raising in a wait's poll ends the wait (logged), raises nothing into vLLM's
    step, and what the step's own poll then finds is reported."""
    p = _holding_p(clock)
    real = p.nixl_wrapper.get_new_notifs
    calls = [0]

    def flaky() -> dict[str, list[bytes]]:
        calls[0] += 1
        if calls[0] == 1:
            return {"d-agent": [b"HB:p1"]}  # a renewal: no news, the wait goes on
        raise RuntimeError("NIXL_ERR_BACKEND")

    monkeypatch.setattr(p.nixl_wrapper, "get_new_notifs", flaky)
    p._wait_while_idle()
    assert calls[0] == 2 and sleeps.slept == [idle.IDLE_POLL_S]
    monkeypatch.setattr(p.nixl_wrapper, "get_new_notifs", real)
    p.nixl_wrapper.deliver("d-agent", b"p1:1")
    assert p._get_new_notifs() == {"p1"}
    assert p.nixl_wrapper.sent == [("d-agent", b"OK:p1")]


def test_no_idle_wait_with_news_to_report(
    clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request an earlier poll found done sending (a verdict wait's, carried to this
    step's poll) is reported at once, not after a wait."""
    p = _holding_p(clock)
    p.__dict__["_lp_done_carry"] = {"p0"}
    polls = _count_polls(p, monkeypatch)
    p._wait_while_idle()
    assert polls[0] == 0 and sleeps.slept == []
    assert p._get_new_notifs() == {"p0"}


def test_the_step_waits_only_when_the_scheduler_marked_it_idle(
    clock: dict[str, float], sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler marks a step that schedules no tokens; the worker's
    get_transfer_results waits in such a step only, before vLLM's own poll."""
    s = make_scheduler(True)
    assert getattr(s.build_connector_meta(MagicMock(total_num_scheduled_tokens=0)), IDLE_ATTR)
    meta = s.build_connector_meta(MagicMock(total_num_scheduled_tokens=7))
    assert getattr(meta, IDLE_ATTR) is False
    p = _holding_p(clock)
    order: list[str] = []
    monkeypatch.setattr(p, "_wait_while_idle", lambda: order.append("wait"))
    monkeypatch.setattr(
        NixlBaseConnectorWorker, "get_transfer_results", lambda self: order.append("vllm")
    )
    p.start_load_kv(meta)  # a step with tokens: no wait
    p.get_transfer_results()
    p.start_load_kv(s.build_connector_meta(MagicMock(total_num_scheduled_tokens=0)))
    p.get_transfer_results()
    p.get_transfer_results()  # a step whose metadata was not bound: no wait
    assert order == ["vllm", "wait", "vllm", "vllm"]
