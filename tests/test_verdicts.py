"""Verified reads (issue 9 §1-2): readers counted from the wire, every
transfer-done answered with a verdict, and the wire forms of OK / NK / LL.

Invariant I13: a transfer-done P handles while the lease is live is answered
OK; one it handles after the lease ended -- expired, aborted, or completed by
earlier transfer-dones -- is answered NK.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from leaseproto.wire import (
    CAPABILITY,
    NACK_REASONS,
    LeaseLost,
    MalformedMessage,
    Nack,
    Ok,
    TransferDone,
    lease_lost,
    verdict,
)

from leaseproto import (
    LateTransfer,
    LeaseTable,
    LocalProtocolError,
    Release,
    ReleaseReason,
    TransferCounted,
    wire,
)


# -- wire --------------------------------------------------------------------------------
def test_verdict_and_lease_lost_formats() -> None:
    assert wire.encode_ok("cmpl-1") == b"OK:cmpl-1"
    assert wire.encode_nack("cmpl-1", "transferred") == b"NK:transferred:cmpl-1"
    assert wire.encode_lease_lost("cmpl-1", "expired") == b"LL:expired:cmpl-1"
    assert wire.decode(b"OK:a:b") == Ok("a:b")
    assert wire.decode(b"NK:unknown:a:1") == Nack("a:1", "unknown")
    assert wire.decode(b"LL:aborted:x") == LeaseLost("x", "aborted")
    assert NACK_REASONS == ("expired", "aborted", "transferred", "unknown")
    assert CAPABILITY == "leaseproto/1"


def test_verdict_messages_round_trip_through_encode() -> None:
    for m in (Ok("a"), *(Nack("b", r) for r in NACK_REASONS), LeaseLost("c", "transferred")):
        (payload,) = wire.encode(m)
        assert wire.decode(payload) == m


@pytest.mark.parametrize(
    "payload", [b"OK:", b"OK:a,b", b"NK:late:x", b"LL:", b"LL:expired", b"LL:gone:x", b"LL::x"]
)
def test_malformed_verdicts(payload: bytes) -> None:
    with pytest.raises(MalformedMessage):
        wire.decode(payload)


@pytest.mark.parametrize("bad", ["OK:x", "LL:y", "OK", "LL"])
def test_new_prefixes_are_reserved(bad: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        wire.check_id(bad)


def test_bad_reasons_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="reason"):
        wire.encode_lease_lost("a", "late")
    with pytest.raises(ValueError, match="reason"):
        wire.encode_nack("a", "live")


@given(
    st.binary(max_size=60).map(lambda b: b"OK:" + b)
    | st.binary(max_size=60).map(lambda b: b"LL:" + b)
)
def test_decode_of_new_prefixes_raises_only_malformed(data: bytes) -> None:
    try:
        msg = wire.decode(data)
    except MalformedMessage:
        return
    assert isinstance(msg, (Ok, LeaseLost))
    assert wire.decode(wire.encode(msg)[0]) == msg


# -- readers from the wire (§2) -------------------------------------------------------------
def test_readers_from_the_wire_override_granted_consumers() -> None:
    # the router picks a 2-rank D after P granted with consumers=1: rank 0's
    # transfer-done must not release the blocks rank 1 is still reading
    t = LeaseTable()
    t.grant("a", now=0.0, consumers=1)
    first = t.transfer_done("a", now=1.0, readers=2)
    assert first == TransferCounted("a", 1.0, done=1, readers=2)
    assert "a" in t
    r = t.transfer_done("a", now=2.0, readers=2)
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED


def test_readers_default_to_granted_consumers() -> None:
    t = LeaseTable()
    t.grant("a", now=0.0, consumers=2)
    assert isinstance(t.transfer_done("a", now=1.0), TransferCounted)
    assert isinstance(t.transfer_done("a", now=2.0), Release)


def test_fewer_readers_on_the_wire_complete_sooner() -> None:
    t = LeaseTable()
    t.grant("a", now=0.0, consumers=4)
    assert isinstance(t.transfer_done("a", now=1.0, readers=1), Release)


def test_transfer_done_after_a_transferred_release_is_late() -> None:
    # a replayed or surplus transfer-done reads blocks P may have reused: NK, not "excess"
    t = LeaseTable()
    t.grant("a", now=0.0)
    assert isinstance(t.transfer_done("a", now=1.0, readers=1), Release)
    late = t.transfer_done("a", now=2.0, readers=1)
    assert late == LateTransfer("a", ReleaseReason.TRANSFERRED, 2.0, ended_at=1.0)
    assert t.stats.excess_transfers == 1
    assert t.transfer_done("a", now=3.0) == LateTransfer(
        "a", ReleaseReason.TRANSFERRED, 3.0, ended_at=1.0
    )


def test_staged_transfer_dones_carry_their_readers() -> None:
    t = LeaseTable()
    assert t.transfer_done("a", now=0.0, readers=2) is None  # staged: nothing known
    assert t.grant("a", now=0.5, consumers=1) is None  # 1 of the 2 readers
    assert t.lease_info("a")["done"] == 1  # type: ignore[index]
    r = t.transfer_done("a", now=1.0, readers=2)
    assert isinstance(r, Release)


def test_staged_transfer_done_with_one_reader_completes_at_grant() -> None:
    t = LeaseTable()
    t.transfer_done("a", now=0.0, readers=1)
    r = t.grant("a", now=0.5, consumers=3)
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", 1 << 21])
def test_bad_readers_are_local_misuse(bad: object) -> None:
    t = LeaseTable()
    t.grant("a", now=0.0)
    with pytest.raises(LocalProtocolError, match="readers"):
        t.transfer_done("a", now=1.0, readers=bad)  # type: ignore[arg-type]
    assert t.lease_info("a")["done"] == 0  # type: ignore[index]


# -- the verdict helper -------------------------------------------------------------------
def test_verdict_for_each_transfer_done_outcome_I13() -> None:
    t = LeaseTable()
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    t.grant("c", now=0.0, consumers=2)
    assert verdict("c", t.transfer_done("c", now=1.0)) == Ok("c")  # partial: lease live
    assert verdict("c", t.transfer_done("c", now=1.0)) == Ok("c")  # completes it
    assert verdict("c", t.transfer_done("c", now=1.0)) == Nack("c", "transferred")
    t.abort("a", now=2.0)
    assert verdict("a", t.transfer_done("a", now=2.0)) == Nack("a", "aborted")
    t.expire(now=30.0)
    assert verdict("b", t.transfer_done("b", now=31.0)) == Nack("b", "expired")
    # no lease and no tombstone: P cannot vouch for the blocks
    assert verdict("zz", t.transfer_done("zz", now=31.0)) == Nack("zz", "unknown")


def test_verdict_refuses_a_result_for_another_id() -> None:
    t = LeaseTable()
    t.grant("a", now=0.0)
    with pytest.raises(LocalProtocolError, match="'b'"):
        verdict("b", t.transfer_done("a", now=1.0))


def test_lease_lost_reason() -> None:
    assert lease_lost("a", ReleaseReason.EXPIRED) == LeaseLost("a", "expired")
    assert lease_lost("a", ReleaseReason.ABORTED) == LeaseLost("a", "aborted")
    assert lease_lost("a", ReleaseReason.TRANSFERRED) == LeaseLost("a", "transferred")
    assert lease_lost("a", None) == LeaseLost("a", "unknown")


def test_transfer_done_message_count_feeds_readers() -> None:
    t = LeaseTable()
    t.grant("r", now=0.0, consumers=1)
    msgs = [wire.decode(wire.encode_transfer_done("r", 2)) for _ in range(3)]
    assert all(isinstance(m, TransferDone) for m in msgs)
    got = [
        verdict(m.req_id, t.transfer_done(m.req_id, now=1.0, readers=m.count))  # type: ignore[union-attr]
        for m in msgs
    ]
    assert got == [Ok("r"), Ok("r"), Nack("r", "transferred")]


def test_lost_reason_for_heartbeats_naming_a_lease_p_no_longer_holds() -> None:
    t = LeaseTable()
    for rid in ("exp", "abt", "xfer", "live"):
        t.grant(rid, now=0.0)
    t.abort("abt", now=1.0)
    t.transfer_done("xfer", now=1.0)
    t.renew(["live"], now=15.0)  # -> 35
    t.expire(now=30.0)  # exp ends
    t.grant("late", now=30.0, ttl=1.0)
    got = {
        rid: t.lost_reason(rid, now=31.0) for rid in ("exp", "abt", "xfer", "live", "late", "zz")
    }
    assert got == {
        "exp": ReleaseReason.EXPIRED,
        "abt": ReleaseReason.ABORTED,
        "xfer": ReleaseReason.TRANSFERRED,
        "live": None,  # P holds it
        "late": ReleaseReason.EXPIRED,  # deadline 31 passed, not reaped yet
        "zz": None,  # never known
    }
    assert [lease_lost(r, got[r]).reason for r in ("exp", "zz")] == ["expired", "unknown"]
