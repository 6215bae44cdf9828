import pytest
from hypothesis import given
from hypothesis import strategies as st
from leaseproto.wire import Abort, Heartbeat, MalformedMessage, Nack, TransferDone

from leaseproto import LeaseConfig, LeaseTable, LocalProtocolError, wire

ID_CHARS = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=",")
ids = st.text(ID_CHARS, min_size=1, max_size=40).filter(
    lambda s: not (s + ":").startswith(("HB:", "AB:", "NK:"))
)


def test_vllm_byte_compatible_formats() -> None:
    assert wire.encode_heartbeat(["cmpl-abc-1a2b3c4d", "cmpl-def-9f8e7d6c"]) == [
        b"HB:cmpl-abc-1a2b3c4d,cmpl-def-9f8e7d6c"
    ]
    assert wire.encode_transfer_done("cmpl-abc-1a2b3c4d", 2) == b"cmpl-abc-1a2b3c4d:2"
    assert wire.decode(b"HB:a,b") == Heartbeat(("a", "b"))
    assert wire.decode(b"chat:cmpl:x:4") == TransferDone("chat:cmpl:x", 4)  # last ':' splits


def test_a_transfer_done_counts_one_reader_by_default() -> None:
    assert wire.encode_transfer_done("cmpl-1") == b"cmpl-1:1"
    assert TransferDone("cmpl-1").count == 1
    assert wire.encode(TransferDone("cmpl-1")) == [b"cmpl-1:1"]


def test_own_messages_round_trip() -> None:
    assert wire.decode(wire.encode_abort("r:1")) == Abort("r:1")
    assert wire.decode(wire.encode_nack("r:1", "expired")) == Nack("r:1", "expired")
    for m in (Heartbeat(("a", "b")), TransferDone("x", 3), Abort("y"), Nack("z", "aborted")):
        (payload,) = wire.encode(m)
        assert wire.decode(payload) == m


def test_heartbeat_split_respects_max_bytes_and_keeps_every_id_once() -> None:
    rids = [f"cmpl-{i:04d}-deadbeef" for i in range(100)]
    msgs = wire.encode_heartbeat(rids + rids[:10], max_bytes=256)
    assert len(msgs) > 1 and all(len(m) <= 256 for m in msgs)
    got = [i for m in msgs for i in wire.decode(m).ids]  # type: ignore[union-attr]
    assert got == rids
    assert wire.encode_heartbeat([]) == []


@pytest.mark.parametrize(
    "bad", ["", "a,b", "x" * 600, "HB:x", "AB:y", "NK:z", "HB", "AB", "NK", "tab\there", 7]
)
def test_unencodable_ids_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        wire.encode_heartbeat([bad])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        wire.encode_transfer_done(bad)  # type: ignore[arg-type]


def test_a_heartbeat_is_at_most_4096_bytes_by_default() -> None:
    """``max_bytes`` defaults to ``LeaseConfig``'s ``max_notification_bytes``."""
    ids = [c * 512 for c in "abcdefg"]  # 7 * 512 + 6 commas: 3,590 bytes
    one = wire.encode_heartbeat([*ids, "h" * 503])  # "HB:" + 3,590 + "," + 503: 4,097
    assert [len(m) for m in one] == [3 + 3590, 3 + 503]
    (full,) = wire.encode_heartbeat([*ids, "h" * 502])  # exactly 4,096
    assert len(full) == 4096 == LeaseConfig().max_notification_bytes


def test_id_too_long_for_max_bytes() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        wire.encode_heartbeat(["x" * 100], max_bytes=64)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, 1 << 21])
def test_bad_counts_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="count"):
        wire.encode_transfer_done("a", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"HB:",
        b"HB:a,,b",
        b"HB:a,",
        b"\xff\xfe",
        b"noseparator",
        b"id:",
        b"id:-1",
        b"id:0",
        b"id:1.5",
        b"id: 2",
        b"id:\xd9\xa3",
        b":3",
        b"NK:late:x",
        b"NK:expired",
        b"AB:",
        b"AB:a,b",
        b"HB:HB:x",
        b"id:99999999",
    ],
)
def test_malformed_payloads(payload: bytes) -> None:
    with pytest.raises(MalformedMessage):
        wire.decode(payload)


def test_encode_refuses_what_is_not_a_message() -> None:
    for bad in ("HB:a", b"HB:a", None, ("a",)):
        with pytest.raises(TypeError, match="not a message"):
            wire.encode(bad)  # type: ignore[arg-type]


def test_verdict_refuses_what_transfer_done_never_returns() -> None:
    for bad in (object(), "r", wire.Ok("r")):
        with pytest.raises(LocalProtocolError, match="not a transfer-done result"):
            wire.verdict("r", bad)  # type: ignore[arg-type]


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(MalformedMessage):
        wire.decode("HB:a")  # type: ignore[arg-type]


_LONG = b"x" * 200


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff" + _LONG,  # not UTF-8
        b"NK:late:" + _LONG,  # bad nack reason
        b"LL:late:" + _LONG,  # bad lease-lost reason
        _LONG,  # no form at all
        _LONG + b":1.5",  # bad transfer-done count
        _LONG + b":0",  # count out of range
    ],
)
def test_a_malformed_message_s_error_quotes_only_its_first_64_bytes(payload: bytes) -> None:
    """A worker logs these errors for whatever a peer sent: the quote is bounded."""
    with pytest.raises(MalformedMessage) as info:
        wire.decode(payload)
    assert str(info.value).endswith(repr(payload[:64])), str(info.value)


@pytest.mark.parametrize("max_bytes", [-1, 0, len(wire.HEARTBEAT_PREFIX)])
def test_a_heartbeat_size_with_no_room_for_an_id_is_refused_with_or_without_ids(
    max_bytes: int,
) -> None:
    for ids in ([], ["a"], ["cmpl-1", "cmpl-2"]):
        with pytest.raises(ValueError, match="leaves no room for an id"):
            wire.encode_heartbeat(ids, max_bytes=max_bytes)
    assert wire.encode_heartbeat(["a"], max_bytes=len(wire.HEARTBEAT_PREFIX) + 1) == [b"HB:a"]


@given(st.binary(max_size=200))
def test_decode_raises_nothing_but_malformed_on_arbitrary_bytes(data: bytes) -> None:
    try:
        msg = wire.decode(data)
    except MalformedMessage:
        return
    assert wire.decode(wire.encode(msg)[0]) == msg  # anything accepted re-encodes


@given(st.lists(ids, max_size=30), st.integers(64, 400))
def test_encode_decode_heartbeat_roundtrip(rids: list[str], max_bytes: int) -> None:
    unique = list(dict.fromkeys(rids))
    try:
        msgs = wire.encode_heartbeat(unique, max_bytes=max_bytes)
    except ValueError:
        assert any(len(r.encode()) > max_bytes - 3 for r in unique)
        return
    assert all(len(m) <= max_bytes for m in msgs)
    assert [i for m in msgs for i in wire.decode(m).ids] == unique  # type: ignore[union-attr]


def route(table: LeaseTable, payload: bytes, now: float) -> bool:
    """What a P worker does with one notification; False when it was dropped."""
    try:
        msg = wire.decode(payload)
    except MalformedMessage:
        return False
    if isinstance(msg, Heartbeat):
        table.renew(msg.ids, now=now)
    elif isinstance(msg, TransferDone):
        table.transfer_done(msg.req_id, now=now)
    elif isinstance(msg, Abort):
        table.abort(msg.req_id, now=now)
    return True


VALID = [b"HB:a,b", b"a:1", b"HB:b", b"b:2", b"AB:c", b"HB:zz"]
JUNK = st.binary(max_size=40).filter(
    lambda b: not b.startswith((b"HB:", b"AB:", b"NK:")) and b":" not in b
) | st.sampled_from([b"HB:", b"HB:a,,b", b"a:0", b"b:x", b"\xffHB:a", b"AB:", b"HB:a,\x00"])


@given(st.lists(JUNK, max_size=12), st.randoms(use_true_random=False))
def test_malformed_messages_change_no_lease(junk: list[bytes], rnd: object) -> None:
    def run(payloads: list[bytes]) -> tuple[object, ...]:
        t = LeaseTable()
        for rid in ("a", "b", "c"):
            t.grant(rid, now=0.0, consumers=2 if rid == "b" else 1)
        dropped = sum(not route(t, p, now=10.0) for p in payloads)
        s = t.stats
        return (
            dropped,
            {r: t.deadline(r) for r in "abc"},
            t.lease_info("b"),
            s.renewed,
            s.renew_unknown,
            s.released_transferred,
            s.released_aborted,
            len(t),
        )

    mixed = VALID + junk
    rnd.shuffle(mixed)  # type: ignore[attr-defined]
    # keep the valid messages in their order; junk anywhere between them
    order = iter(VALID)
    mixed = [next(order) if m in VALID else m for m in mixed]
    got, want = run(mixed), run(VALID)
    assert got[0] == len(junk) and want[0] == 0
    assert got[1:] == want[1:]


# -- the whole-payload heartbeat check decides exactly as the per-id one -------------------
from hypothesis import given as _given  # noqa: E402
from hypothesis import settings as _settings  # noqa: E402
from hypothesis import strategies as _st  # noqa: E402

_pieces = _st.sampled_from(
    [
        "a",
        "chatcmpl-1f",
        "HB",
        "HB:",
        "AB:",
        "OK",
        "NK:x",
        "LL",
        "LLx",
        ":",
        "x:1",
        "é",
        "\x00",
        "\x1f",
        "\x7f",
        "\u2028",
        " ",
        "",
        "Z" * 200,
        "\ud800",
    ]
)
_id = _st.lists(_pieces, min_size=0, max_size=4).map("".join)


def _per_id(data: bytes) -> object:
    """What decode did before the whole-payload check: validate every id."""
    text = data.decode("utf-8")
    return wire.Heartbeat(tuple(wire._valid_id(p, data) for p in text[3:].split(",")))


@_settings(max_examples=1500)
@_given(_st.lists(_id, min_size=1, max_size=6))
def test_heartbeat_fast_check_decides_as_the_per_id_check(ids: list[str]) -> None:
    try:
        data = b"HB:" + ",".join(ids).encode("utf-8")
    except UnicodeEncodeError:
        return
    try:
        want: object = _per_id(data)
    except (wire.MalformedMessage, UnicodeDecodeError) as exc:
        want = type(exc), str(exc)
    try:
        got: object = wire.decode(data)
    except wire.MalformedMessage as exc:
        got = type(exc), str(exc)
    if isinstance(want, tuple) and want[0] is UnicodeDecodeError:
        assert isinstance(got, tuple) and "not UTF-8" in got[1]
        return
    assert got == want
    plain = wire._plain_ids(data, data.decode("utf-8")[3:])
    if plain is not None:  # the fast path only ever accepts what the per-id path accepts
        assert want == wire.Heartbeat(tuple(plain))


def test_heartbeat_fast_check_takes_plain_ids_and_leaves_the_rest() -> None:
    assert wire._plain_ids(b"HB:abc,x:1", "abc,x:1") == ["abc", "x:1"]
    for body in ("abc,HB:1", "abc,LL", "abc,,d", "ab\x01c", "\u00e9t\u00e9"):
        assert wire._plain_ids(b"HB:" + body.encode(), body) is None


def _each(ids: list[str], max_bytes: int) -> object:
    try:
        return wire._encode_each(ids, max_bytes - 3, max_bytes)
    except (ValueError, TypeError) as exc:
        return type(exc), str(exc)


@_settings(max_examples=1500)
@_given(
    _st.lists(_st.one_of(_id, _st.sampled_from(["abc", "abc", "d" * 30])), max_size=12),
    _st.sampled_from([4, 5, 8, 12, 40, 100, 4096]),
)
def test_heartbeat_encoding_cuts_where_the_per_id_encoder_does(
    ids: list[str], max_bytes: int
) -> None:
    want = _each(ids, max_bytes)
    try:
        got: object = wire.encode_heartbeat(iter(ids), max_bytes=max_bytes)
    except (ValueError, TypeError) as exc:
        got = type(exc), str(exc)
    assert got == want
    if wire._encode_plain(list(ids), max_bytes - 3) is not None:
        assert not isinstance(want, tuple)  # the fast path never accepts what fails


@_settings(max_examples=1500)
@_given(_id, _st.sampled_from([1, 3, 10, 60, 512, 4096]))
def test_plain_id_accepts_only_what_id_problem_accepts(rid: str, max_bytes: int) -> None:
    if wire.plain_id(rid, max_bytes):
        assert wire.id_problem(rid) is None and len(rid.encode()) <= max_bytes
    assert wire.plain_id("chatcmpl-1f-00000001")


def test_plain_id_takes_an_id_with_a_colon_unless_it_starts_with_a_reserved_prefix() -> None:
    for rid in ("chat:cmpl-1", "x:1", "HBx:1", "hb:1"):
        assert wire.plain_id(rid), rid
    for rid in ("HB:1", "AB:x", "OK:x", "NK:x", "LL:x"):
        assert not wire.plain_id(rid) and wire.id_problem(rid) is not None, rid
