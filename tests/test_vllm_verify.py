"""Verified reads (I13): D holds a finished READ until every P agent it read
from said OK. No vLLM needed."""

from __future__ import annotations

import pytest

from leaseproto import wire
from leaseproto.integrations.vllm.verify import (
    DEFAULT_VERDICT_WAIT,
    HELLO_PREFIX,
    VERDICT_WAIT_KEY,
    ReadVerifier,
    VerdictWaits,
    decode_hello,
    encode_hello,
    verdict_wait,
)


def test_read_is_held_until_ok() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=9.0)
    assert v.settle({"d1"}, set(), now=10.0) == (set(), set())
    assert v.held() == ["d1"]
    assert v.on_message(wire.Ok("p1"), "a") is None
    assert v.settle(set(), set(), now=10.5) == ({"d1"}, set())
    assert v.stats.verified == 1 and v.held() == [] and len(v) == 0


@pytest.mark.parametrize("reason", ["expired", "aborted", "transferred", "unknown"])
def test_nk_fails_the_load(reason: str) -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=9.0)
    v.on_message(wire.Nack("p1", reason), "a")  # may arrive before D sees its READ done
    assert v.settle({"d1"}, set(), now=10.0) == ({"d1"}, {"d1"})
    assert v.stats.refused == 1


def test_no_verdict_within_the_bound_fails_the_load() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=9.0)
    assert v.settle({"d1"}, set(), now=10.0) == (set(), set())
    assert v.settle(set(), set(), now=14.9) == (set(), set())
    assert v.settle(set(), set(), now=15.0) == ({"d1"}, {"d1"})
    assert v.stats.timed_out == 1
    assert v.take_silent() == {"a"} and v.take_silent() == set()


def test_nk_wins_over_ok_and_ll_is_advisory() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=0.0)
    v.on_message(wire.LeaseLost("p1", "expired"), "a")
    v.on_message(wire.Ok("p1"), "a")
    v.on_message(wire.Nack("p1", "expired"), "a")
    assert v.settle({"d1"}, set(), now=1.0) == ({"d1"}, {"d1"})
    assert v.stats.lease_lost == 1


def test_unverified_and_failed_reads_pass_through() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=0.0)
    assert v.settle({"x", "d1"}, {"d1"}, now=1.0) == ({"x", "d1"}, {"d1"})
    assert v.held() == []


def test_ok_from_every_agent_read() -> None:
    """P TP > D TP: one D rank reads two P ranks, each with its own lease."""
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a0", now=0.0)
    v.expect("d1", "p1", "a1", now=0.0)
    v.on_message(wire.Ok("p1"), "a0")
    assert v.settle({"d1"}, set(), now=1.0) == (set(), set())  # a1 has not answered
    assert v.missing("d1") == {"a1"}
    v.on_message(wire.Ok("p1"), "a1")
    assert v.settle(set(), set(), now=1.1) == ({"d1"}, set())


def test_nk_from_one_rank_after_ok_from_another_fails() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a0", now=0.0)
    v.expect("d1", "p1", "a1", now=0.0)
    v.on_message(wire.Ok("p1"), "a0")
    v.on_message(wire.Nack("p1", "expired"), "a1")
    assert v.settle({"d1"}, set(), now=1.0) == ({"d1"}, {"d1"})


def test_a_verdict_from_an_agent_not_read_is_ignored() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a0", now=0.0)
    assert v.on_message(wire.Ok("p1"), "stranger") == "foreign"
    assert v.on_message(wire.Nack("p1", "expired"), "stranger") == "foreign"
    assert v.on_message(wire.LeaseLost("p1", "expired"), "stranger") == "foreign"
    assert v.settle({"d1"}, set(), now=1.0) == (set(), set())
    assert v.stats.foreign == 3 and v.stats.lease_lost == 0
    v.on_message(wire.Ok("p1"), "a0")
    assert v.settle(set(), set(), now=1.5) == ({"d1"}, set())


def test_one_ok_answers_one_transfer_done() -> None:
    """Two local requests naming one P id: one OK settles one of them."""
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=0.0)
    v.expect("d2", "p1", "a", now=0.0)
    v.on_message(wire.Ok("p1"), "a")
    assert v.settle({"d1", "d2"}, set(), now=1.0) == ({"d1"}, set())
    assert v.on_message(wire.Ok("p1"), "a") is None
    assert v.settle(set(), set(), now=1.1) == ({"d2"}, set())


def test_verdicts_for_no_read_are_not_kept() -> None:
    """Today's bug: every verdict was stored by id until a read of that id settled."""
    v = ReadVerifier(bound=5.0)
    for i in range(10_000):
        assert v.on_message(wire.Ok(f"forged-{i}"), "a") == "unmatched"
    assert v.stats.unmatched == 10_000 and len(v) == 0
    v.expect("d1", "forged-7", "a", now=0.0)  # an OK sent before the read counts for nothing
    assert v.settle({"d1"}, set(), now=1.0) == (set(), set())


def test_a_read_that_never_completes_is_forgotten_and_fails_if_seen() -> None:
    v = ReadVerifier(bound=5.0, stale_after=100.0, max_forgotten=2)
    v.expect("d1", "p1", "a", now=0.0)
    assert v.settle(set(), set(), now=99.0) == (set(), set()) and len(v) == 1
    v.settle(set(), set(), now=100.0)
    assert len(v) == 0 and v.stats.stale == 1
    assert v.settle({"d1"}, set(), now=101.0) == ({"d1"}, {"d1"})  # never passed unverified
    for i in range(5):
        v.expect(f"s{i}", f"q{i}", "a", now=200.0)
    v.settle(set(), set(), now=300.0)
    assert len(v._forgotten) == 2  # bounded


def test_hello_is_never_a_vllm_message() -> None:
    raw = encode_hello(b"\x00meta:1")
    assert raw.startswith(HELLO_PREFIX) and decode_hello(raw) == b"\x00meta:1"
    assert decode_hello(b"HB:a,b") is None and decode_hello(b"req:1") is None
    with pytest.raises(wire.MalformedMessage):
        wire.decode(encode_hello(b"meta:1"))  # no valid id contains ','


def test_awaiting_names_the_agents_a_finished_read_still_needs() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1", "a", now=0.0)
    v.expect("d1", "p1", "b", now=0.0)
    v.expect("d2", "p2", "a", now=0.0)
    assert v.awaiting({"d1", "d2"}) == set()  # neither READ has completed
    v.settle({"d1", "d2"}, set(), now=1.0)
    assert v.awaiting({"d1"}) == {"a", "b"}
    v.on_message(wire.Ok("p1"), "a")
    assert v.awaiting({"d1"}) == {"b"} and v.awaiting({"d2"}) == {"a"}
    v.on_message(wire.Nack("p2", "expired"), "a")
    assert v.awaiting({"d2"}) == set()  # refused: nothing more to wait for
    assert v.awaiting({"nobody"}) == set()


def test_verdict_waits_back_off_from_an_agent_that_missed() -> None:
    w = VerdictWaits(wait=0.01, retry_after=5.0)
    assert w.worth({"a", "b"}, now=0.0)
    w.ended({"a", "b"}, {"a"}, now=0.0)  # b answered in time, a did not
    assert not w.worth({"a"}, now=4.9) and not w.worth({"a", "b"}, now=4.9)
    assert w.worth({"b"}, now=4.9)
    assert w.worth({"a"}, now=5.0)  # retried once retry_after has passed
    w.ended({"a"}, set(), now=5.0)  # answered this time
    assert w.worth({"a"}, now=5.0)
    w.ended({"c"}, {"c"}, now=6.0)
    w.ended({"d"}, {"d"}, now=20.0)
    assert set(w._missed) == {"d"}  # a miss older than retry_after is not kept
    assert not VerdictWaits(wait=0.0, retry_after=5.0).worth({"a"}, now=0.0)


@pytest.mark.parametrize("value", [-0.001, 8.0, 9, float("nan"), float("inf"), True, "0.01", None])
def test_a_bad_verdict_wait_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=VERDICT_WAIT_KEY):
        verdict_wait({VERDICT_WAIT_KEY: value}, 8.0)


def test_verdict_wait_default_and_setting() -> None:
    assert verdict_wait(None, 8.0) == verdict_wait({}, 8.0) == DEFAULT_VERDICT_WAIT
    assert verdict_wait({"kv_lease_duration": 12}, 8.0) == DEFAULT_VERDICT_WAIT
    assert verdict_wait({VERDICT_WAIT_KEY: 0}, 8.0) == 0.0
    assert verdict_wait({VERDICT_WAIT_KEY: 0.05}, 8.0) == 0.05
