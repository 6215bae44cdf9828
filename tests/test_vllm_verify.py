"""Verified reads (I13): D holds a finished READ until P's verdict. No vLLM needed."""

from __future__ import annotations

import pytest

from leaseproto import wire
from leaseproto.integrations.vllm.verify import (
    HELLO_PREFIX,
    ReadVerifier,
    decode_hello,
    encode_hello,
)


def test_read_is_held_until_ok() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1")
    assert v.settle({"d1"}, set(), now=10.0) == (set(), set())
    assert v.held() == ["d1"]
    v.on_message(wire.Ok("p1"))
    assert v.settle(set(), set(), now=10.5) == ({"d1"}, set())
    assert v.stats.verified == 1 and v.held() == []


@pytest.mark.parametrize("reason", ["expired", "aborted", "transferred", "unknown"])
def test_nk_fails_the_load(reason: str) -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1")
    v.on_message(wire.Nack("p1", reason))  # may arrive before D sees its READ done
    assert v.settle({"d1"}, set(), now=10.0) == ({"d1"}, {"d1"})
    assert v.stats.refused == 1


def test_no_verdict_within_the_bound_fails_the_load() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1")
    assert v.settle({"d1"}, set(), now=10.0) == (set(), set())
    assert v.settle(set(), set(), now=14.9) == (set(), set())
    assert v.settle(set(), set(), now=15.0) == ({"d1"}, {"d1"})
    assert v.stats.timed_out == 1


def test_nk_wins_over_ok_and_ll_is_advisory() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1")
    v.on_message(wire.LeaseLost("p1", "expired"))
    v.on_message(wire.Ok("p1"))
    v.on_message(wire.Nack("p1", "expired"))
    assert v.settle({"d1"}, set(), now=1.0) == ({"d1"}, {"d1"})
    assert v.stats.lease_lost == 1


def test_unverified_and_failed_reads_pass_through() -> None:
    v = ReadVerifier(bound=5.0)
    v.expect("d1", "p1")
    assert v.settle({"x", "d1"}, {"d1"}, now=1.0) == ({"x", "d1"}, {"d1"})
    assert v.held() == []


def test_hello_is_never_a_vllm_message() -> None:
    raw = encode_hello(b"\x00meta:1")
    assert raw.startswith(HELLO_PREFIX) and decode_hello(raw) == b"\x00meta:1"
    assert decode_hello(b"HB:a,b") is None and decode_hello(b"req:1") is None
    with pytest.raises(wire.MalformedMessage):
        wire.decode(encode_hello(b"meta:1"))  # no valid id contains ','
