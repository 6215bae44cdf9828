"""Bad input to the core (issue 9 §4): a clear LocalProtocolError, nothing changed.

Each test here failed on main before the fix: a grant at ``now=nan`` was never
expired, ``kv_lease_duration=1e308`` derived an infinite extension, and ids
that cannot go on the wire were accepted by ``grant`` and ``track`` (D then
failed inside its step, encoding the heartbeat).
"""

import math

import pytest

from leaseproto import (
    HeartbeatTracker,
    LeaseConfig,
    LeaseTable,
    LocalProtocolError,
    ReleaseReason,
    wire,
)
from leaseproto.core.checks import advance, check_count, check_now, check_wire_id
from leaseproto.core.errors import LeaseProtocolError, RemoteProtocolError

BAD_NOW = [math.nan, math.inf, -math.inf]


# -- non-finite now -----------------------------------------------------------------------
@pytest.mark.parametrize("now", BAD_NOW)
def test_grant_at_a_non_finite_now_is_refused(now: float) -> None:
    t = LeaseTable()
    with pytest.raises(LocalProtocolError, match="finite"):
        t.grant("a", now=now)
    assert len(t) == 0 and t.stats.granted == 0
    t.grant("a", now=0.0)  # the table's clock did not move
    assert t.expire(now=30.0)[0].req_id == "a"


@pytest.mark.parametrize("now", BAD_NOW)
def test_every_table_input_refuses_a_non_finite_now(now: float) -> None:
    t = LeaseTable()
    t.grant("a", now=1.0)
    for call in (
        lambda: t.renew(["a"], now=now),
        lambda: t.transfer_done("a", now=now),
        lambda: t.abort("a", now=now),
        lambda: t.expire(now=now),
        lambda: t.renew_heartbeat(b"HB:a", now=now),
    ):
        with pytest.raises(LocalProtocolError, match="finite"):
            call()
    assert t.deadline("a") == 31.0 and t.lease_info("a")["done"] == 0  # type: ignore[index]
    assert [r.req_id for r in t.expire(now=31.0)] == ["a"]


@pytest.mark.parametrize("now", [None, "2", [2.0]])
def test_every_table_input_refuses_a_now_that_is_not_a_number(now: object) -> None:
    # compared with the clock, these raise TypeError: each input says LocalProtocolError
    t = LeaseTable()
    t.grant("a", now=1.0)
    for call in (
        lambda: t.renew_heartbeat(b"HB:a", now=now),  # type: ignore[arg-type]
        lambda: t.renew(["a"], now=now),  # type: ignore[arg-type]
        lambda: t.transfer_done("a", now=now),  # type: ignore[arg-type]
        lambda: t.abort("a", now=now),  # type: ignore[arg-type]
        lambda: t.expire(now=now),  # type: ignore[arg-type]
    ):
        with pytest.raises(LocalProtocolError, match="finite number"):
            call()
    assert t.deadline("a") == 31.0 and t.stats.renewed == 0
    assert t.renew_heartbeat(b"HB:a", now=2.0) == ["a"] and t.deadline("a") == 31.0
    assert [r.req_id for r in t.expire(now=31.0)] == ["a"]


@pytest.mark.parametrize("now", [True, False])
def test_every_table_input_refuses_a_bool_now(now: bool) -> None:
    # a bool is an int, and at a clock of 0.0 it passed every comparison: True was
    # taken as 1.0 (the table renewed at it); check_finite refuses bools
    t = LeaseTable()
    t.grant("a", now=0.0)
    for call in (
        lambda: t.grant("b", now=now),
        lambda: t.renew_heartbeat(b"HB:a", now=now),
        lambda: t.renew(["a"], now=now),
        lambda: t.transfer_done("a", now=now),
        lambda: t.abort("a", now=now),
        lambda: t.expire(now=now),
        lambda: t.lost_reason("a", now=now),
        lambda: advance(0.0, now),
    ):
        with pytest.raises(LocalProtocolError, match="finite number"):
            call()
    assert len(t) == 1 and t.stats.renewed == 0 and t.deadline("a") == 30.0
    assert t.renew_heartbeat(b"HB:a", now=0.0) == ["a"]  # the table's clock did not move


@pytest.mark.parametrize("sent", [False, True])
@pytest.mark.parametrize("now", [True, False])
def test_the_tracker_refuses_a_bool_now(now: bool, sent: bool) -> None:
    # both of due's paths: an engine never sent to (due at once: the checked path)
    # and one sent at 0.0 (below its threshold: the inline idle path)
    d = HeartbeatTracker()
    d.track("a", engine_id="P", now=0.0)
    if sent:
        assert d.due(now=0.0) == {"P": ["a"]}
    for call in (lambda: d.track("b", engine_id="P", now=now), lambda: d.due(now=now)):
        with pytest.raises(LocalProtocolError, match="finite number"):
            call()
    assert len(d) == 1
    assert d.due(now=0.0) == ({} if sent else {"P": ["a"]})  # no turn taken, none given


@pytest.mark.parametrize("now", [math.nan, "2", None, True])
def test_lost_reason_refuses_a_now_that_is_not_a_finite_number(now: object) -> None:
    # a query, so it does not move the clock; a NaN answered None (P holds it) and a
    # str raised TypeError from inside the comparison
    t = LeaseTable()
    t.grant("a", now=0.0)
    with pytest.raises(LocalProtocolError, match="finite number"):
        t.lost_reason("a", now=now)  # type: ignore[arg-type]
    assert t.lost_reason("a", now=30.0) is ReleaseReason.EXPIRED


@pytest.mark.parametrize("now", BAD_NOW)
def test_a_fresh_table_refuses_a_non_finite_now_as_its_first_input(now: float) -> None:
    # the clock starts at -inf: the first call's check must still refuse now=-inf
    # (renew_heartbeat checks the clock inline, not through advance())
    t = LeaseTable()
    for call in (
        lambda: t.renew_heartbeat(b"HB:a", now=now),
        lambda: t.renew(["a"], now=now),
        lambda: t.transfer_done("a", now=now),
        lambda: t.abort("a", now=now),
        lambda: t.expire(now=now),
    ):
        with pytest.raises(LocalProtocolError, match="finite"):
            call()
    assert t.stats == LeaseTable().stats  # nothing counted, nothing staged
    assert t.renew_heartbeat(b"HB:a", now=0.0) == ["a"]
    assert t.stats.renew_unknown == 1


@pytest.mark.parametrize("now", BAD_NOW)
def test_tracker_refuses_a_non_finite_now(now: float) -> None:
    d = HeartbeatTracker()
    with pytest.raises(LocalProtocolError, match="finite"):
        d.track("a", engine_id="P", now=now)
    assert len(d) == 0
    d.track("a", engine_id="P", now=0.0)
    with pytest.raises(LocalProtocolError, match="finite"):
        d.due(now=now)
    assert d.due(now=0.0) == {"P": ["a"]}  # its turn was not taken


# -- ttl and consumers --------------------------------------------------------------------
@pytest.mark.parametrize("ttl", [math.nan, math.inf, 0.0, -1.0, True, "3"])
def test_bad_ttl_is_local_misuse(ttl: object) -> None:
    t = LeaseTable()
    with pytest.raises(LocalProtocolError, match="ttl"):
        t.grant("a", now=0.0, ttl=ttl)  # type: ignore[arg-type]
    assert len(t) == 0


def test_a_ttl_whose_deadline_overflows_is_refused() -> None:
    t = LeaseTable()
    with pytest.raises(LocalProtocolError, match="finite"):
        t.grant("a", now=1e308, ttl=1e308)
    assert len(t) == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_consumers_is_local_misuse(bad: object) -> None:
    with pytest.raises(LocalProtocolError, match="consumers"):
        LeaseTable().grant("a", now=0.0, consumers=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", 2**32])
def test_bad_readers_is_local_misuse_and_changes_nothing(bad: object) -> None:
    t = LeaseTable()
    t.grant("a", now=0.0, consumers=2)
    for rid in ("a", "early"):  # a live lease, and an id that would be staged
        with pytest.raises(LocalProtocolError, match="readers"):
            t.transfer_done(rid, now=1.0, readers=bad)  # type: ignore[arg-type]
    assert t.lease_info("a")["done"] == 0 and t.stats.early_staged == 0  # type: ignore[index]
    assert t.transfer_done("a", now=1.0, readers=1) is not None and "a" not in t


# -- durations: derived values must be finite too (C1) ---------------------------------------
@pytest.mark.parametrize("duration", [1e308, 1.5e308])
def test_config_refuses_a_duration_that_derives_an_infinite_extension(duration: float) -> None:
    # `--kv-lease-duration 1e308`: E = 2L/3 overflows to inf
    with pytest.raises(ValueError, match=r"lease_extension.*C1"):
        LeaseConfig(kv_lease_duration=duration)


def test_config_values_stay_finite_at_the_largest_accepted_duration() -> None:
    cfg = LeaseConfig(kv_lease_duration=1e9)
    assert all(math.isfinite(v) for v in cfg.as_dict().values() if isinstance(v, float))


# -- ids that cannot go on the wire (C7) ----------------------------------------------------
BAD_IDS = ["", "a,b", "tab\there", "nl\n", "HB:x", "OK", "LL:y", "x" * 600, 7, None]


@pytest.mark.parametrize("rid", BAD_IDS)
def test_grant_refuses_ids_that_cannot_go_on_the_wire(rid: object) -> None:
    t = LeaseTable()
    with pytest.raises(LocalProtocolError, match="request id"):
        t.grant(rid, now=0.0)  # type: ignore[arg-type]
    assert len(t) == 0 and t.stats.granted == 0


@pytest.mark.parametrize("rid", BAD_IDS)
def test_track_refuses_remote_ids_that_cannot_go_on_the_wire(rid: object) -> None:
    d = HeartbeatTracker()
    if rid is not None:  # None: P's id is the local one
        with pytest.raises(LocalProtocolError, match="request id"):
            d.track("local-1", engine_id="P", remote_req_id=rid, now=0.0)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="request id"):
        d.track(rid, engine_id="P", now=0.0)  # type: ignore[arg-type]
    assert len(d) == 0 and d.due(now=0.0) == {}


def test_a_local_id_that_is_not_sent_need_not_be_wire_safe() -> None:
    d = HeartbeatTracker()
    d.track("local,with,commas", engine_id="P", remote_req_id="cmpl-1", now=0.0)
    assert d.due(now=0.0) == {"P": ["cmpl-1"]}


def test_C7_the_longest_allowed_id_fits_every_message() -> None:
    for size in (64, 128, 515, 527, 4096):
        cfg = LeaseConfig(max_notification_bytes=size)
        longest = "x" * cfg.max_id_bytes
        assert cfg.max_id_bytes == min(wire.MAX_ID_BYTES, size - wire.VERDICT_OVERHEAD)
        LeaseTable(cfg).grant(longest, now=0.0)
        HeartbeatTracker(cfg).track(longest, engine_id="P", now=0.0)
        payloads = [
            *wire.encode_heartbeat([longest], max_bytes=size),
            wire.encode_transfer_done(longest, wire.MAX_COUNT),
            wire.encode_abort(longest),
            wire.encode_ok(longest),
            *(wire.encode_nack(longest, r) for r in wire.NACK_REASONS),
            *(wire.encode_lease_lost(longest, r) for r in wire.LOST_REASONS),
        ]
        assert max(map(len, payloads)) <= size
        assert max(map(len, payloads)) == size or cfg.max_id_bytes == wire.MAX_ID_BYTES
        with pytest.raises(LocalProtocolError, match="bytes"):
            LeaseTable(cfg).grant(longest + "x", now=0.0)
        with pytest.raises(LocalProtocolError, match="bytes"):
            HeartbeatTracker(cfg).track("a", engine_id="P", remote_req_id=longest + "x", now=0.0)


def test_the_tracker_never_fails_inside_due_for_an_id_it_accepted() -> None:
    cfg = LeaseConfig(max_notification_bytes=64)
    d = HeartbeatTracker(cfg)
    d.track("a", engine_id="P", remote_req_id="y" * cfg.max_id_bytes, now=0.0)
    (ids,) = d.due(now=0.0).values()
    assert all(len(p) <= 64 for p in wire.encode_heartbeat(ids, max_bytes=64))


@pytest.mark.parametrize("rid", ["cmpl-1", "réq-ü", "a" * 512, "é" * 256])
def test_check_wire_id_returns_the_id_it_accepts_plain_or_not(rid: str) -> None:
    """The fast path (``wire.plain_id``: ASCII) and the full check (any other
    valid id) both hand the id back."""
    assert check_wire_id(rid, 512) == rid


@pytest.mark.parametrize("value", [1, 3, 7])
def test_check_count_returns_the_count_it_accepts(value: int) -> None:
    assert check_count("readers", value, 7) == value
    with pytest.raises(LocalProtocolError, match="readers=8"):
        check_count("readers", 8, 7)


def test_a_now_equal_to_the_last_is_taken_an_earlier_one_refused() -> None:
    assert check_now(1.0, 1.0) == 1.0 and advance(1.0, 1.0) == 1.0
    with pytest.raises(LocalProtocolError, match="backwards"):
        check_now(0.5, 1.0)


@pytest.mark.parametrize("now", ["1.0", None, [1.0]])
def test_advance_refuses_a_now_that_is_not_a_number(now: object) -> None:
    with pytest.raises(LocalProtocolError, match="finite number"):
        advance(0.0, now)  # type: ignore[arg-type]


def test_an_id_both_malformed_and_too_long_is_refused_for_the_malformation() -> None:
    """The wire-format problem is what the error names; the size limit of C7 is
    only checked for an id that is otherwise valid."""
    with pytest.raises(LocalProtocolError, match="contains ','"):
        check_wire_id("a,b" + "x" * 200, 100)
    with pytest.raises(LocalProtocolError, match="rule C7"):
        check_wire_id("x" * 200, 100)


def test_an_id_that_is_not_utf_8_is_refused_as_misuse() -> None:
    bad = "req-\ud800"  # a lone surrogate: a str that UTF-8 cannot encode
    with pytest.raises(LocalProtocolError, match="UTF-8"):
        LeaseTable(LeaseConfig()).grant(bad, now=0.0)
    with pytest.raises(LocalProtocolError, match="UTF-8"):
        HeartbeatTracker(LeaseConfig()).track("d", engine_id="p", remote_req_id=bad, now=0.0)


def test_the_base_protocol_error_is_abstract_and_its_two_kinds_are_not() -> None:
    with pytest.raises(TypeError, match="abstract"):
        LeaseProtocolError("boom")
    for cls in (LocalProtocolError, RemoteProtocolError):
        err = cls("boom")
        assert isinstance(err, LeaseProtocolError) and err.args == ("boom",)
        with pytest.raises(LeaseProtocolError, match="boom"):
            raise err
