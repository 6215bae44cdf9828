"""The cluster key's frames (spec §3.6, §10.3): a stranger, a wrong key, a
replay or a frame of another connection is refused and counted; reordering
within the window is accepted; without a key nothing changes on the wire."""

from __future__ import annotations

import itertools

import pytest

from leaseproto.core import wire
from leaseproto.core.mac import (
    FRAME_OVERHEAD,
    FRAME_PREFIX,
    REPLAY_WINDOW,
    ClusterKey,
    MalformedFrame,
    ReplayWindow,
    unpack,
)
from leaseproto.core.mac_peers import ANSWER, GREETING, PeerAuth, Refused

KEY = ClusterKey.from_bytes(b"correct horse battery staple 0123456789")
OTHER = ClusterKey.from_bytes(b"another cluster's key, also long enough")


def _pair(key_d: ClusterKey = KEY, key_p: ClusterKey = KEY) -> tuple[PeerAuth, PeerAuth]:
    nd, np = itertools.count(1), itertools.count(1000)
    d = PeerAuth(key_d, "decode-r0", nonces=lambda: next(nd).to_bytes(8, "big"))
    p = PeerAuth(key_p, "prefill-r0", nonces=lambda: next(np).to_bytes(8, "big"))
    return d, p


def _send(src: PeerAuth, dst: PeerAuth, payload: bytes) -> bytes | Refused:
    frame = src.seal(dst.agent, payload)
    assert frame is not None
    return dst.open(src.agent, frame)


def _connect(d: PeerAuth, p: PeerAuth) -> None:
    d.expect(p.agent)
    assert _send(d, p, GREETING) == GREETING
    assert _send(p, d, ANSWER) == ANSWER
    assert d.ready(p.agent)


def test_a_connection_carries_every_message_of_ours_both_ways() -> None:
    d, p = _pair()
    _connect(d, p)
    for payload in (b"HB:a,b", b"req-1:2", b"AB:req-2"):
        assert _send(d, p, payload) == payload
    for payload in (wire.encode_ok("req-1"), b"NK:expired:req-2", b"LL:unknown:req-3"):
        assert _send(p, d, payload) == payload
    assert not any(d.dropped.values()) and not any(p.dropped.values())


def test_a_frame_is_the_prefix_then_fixed_fields_then_the_message() -> None:
    d, p = _pair()
    _connect(d, p)
    frame = d.seal(p.agent, b"HB:a")
    assert frame is not None and frame.startswith(FRAME_PREFIX)
    assert len(frame) == FRAME_OVERHEAD + len(b"HB:a")
    assert frame.endswith(b"HB:a")
    with pytest.raises(wire.MalformedMessage):  # a peer without the key drops it as malformed
        wire.decode(frame)


def test_without_a_connection_a_peer_that_never_greeted_gets_the_bytes_unchanged() -> None:
    d, _ = _pair()
    assert d.seal("stock-vllm-prefill", b"HB:x") == b"HB:x"
    assert d.seal("stock-vllm-prefill", b"x:1") == b"x:1"


def test_nothing_but_the_greeting_goes_to_a_keyed_peer_before_it_answered() -> None:
    d, p = _pair()
    d.expect(p.agent)
    assert not d.ready(p.agent)
    assert d.seal(p.agent, b"HB:x") is None
    assert d.unsealed == 1
    greeting = d.seal(p.agent, GREETING)
    assert greeting is not None and unpack(greeting).kind == b"g"


@pytest.mark.parametrize("payload", [b"HB:req-1", b"req-1:1", b"AB:req-1", GREETING])
def test_an_unsealed_message_is_dropped_and_counted(payload: bytes) -> None:
    _, p = _pair()
    got = p.open("third-agent", payload)
    assert isinstance(got, Refused) and got.reason == "unauthenticated"
    assert p.dropped["unauthenticated"] == 1 and p.strangers == 1


def test_a_peer_with_another_key_is_a_stranger() -> None:
    d, p = _pair(key_d=OTHER)
    d.expect(p.agent)
    got = _send(d, p, GREETING)
    assert isinstance(got, Refused) and got.reason == "bad mac"
    assert p.strangers == 1
    assert p.seal(d.agent, ANSWER) == ANSWER  # never greeted us: P has no connection
    # ... and P answers nothing anyway: its worker never saw a greeting


def test_a_message_sealed_for_another_receiver_or_from_another_sender_fails() -> None:
    d, p = _pair()
    _connect(d, p)
    frame = d.seal(p.agent, b"HB:a")
    assert frame is not None
    got = p.open("someone-else", frame)  # the sender's name is under the MAC
    assert isinstance(got, Refused)
    other = PeerAuth(KEY, "prefill-r1")
    got = other.open(d.agent, frame)  # so is the receiver's (and its connection)
    assert isinstance(got, Refused) and got.reason == "unknown connection"


def test_a_tampered_payload_fails_its_mac() -> None:
    d, p = _pair()
    _connect(d, p)
    frame = d.seal(p.agent, b"HB:aaaa")
    assert frame is not None
    got = p.open(d.agent, frame[:-1] + b"b")
    assert isinstance(got, Refused) and got.reason == "bad mac"


def test_a_replayed_message_is_refused() -> None:
    d, p = _pair()
    _connect(d, p)
    frame = d.seal(p.agent, b"req-1:1")
    assert frame is not None
    assert p.open(d.agent, frame) == b"req-1:1"
    again = p.open(d.agent, frame)
    assert isinstance(again, Refused) and again.reason == "replayed"
    verdict = p.seal(d.agent, b"OK:req-1")
    assert verdict is not None
    assert d.open(p.agent, verdict) == b"OK:req-1"
    assert isinstance(d.open(p.agent, verdict), Refused)
    assert p.dropped["replayed"] == 1 and d.dropped["replayed"] == 1


def test_reordered_messages_within_the_window_are_accepted_once() -> None:
    d, p = _pair()
    _connect(d, p)
    frames = [d.seal(p.agent, f"HB:r{i}".encode()) for i in range(200)]
    order = [*range(199, -1, -3), *range(198, -1, -3), *range(197, -1, -3)]
    got = [p.open(d.agent, frames[i]) for i in order]  # type: ignore[arg-type]
    assert got == [f"HB:r{i}".encode() for i in order]
    assert all(isinstance(p.open(d.agent, f), Refused) for f in frames)  # type: ignore[arg-type]


def test_a_message_older_than_the_window_is_refused() -> None:
    d, p = _pair()
    _connect(d, p)
    old = d.seal(p.agent, b"HB:old")
    for _ in range(REPLAY_WINDOW):
        assert p.open(d.agent, d.seal(p.agent, b"HB:new")) == b"HB:new"  # type: ignore[arg-type]
    got = p.open(d.agent, old)  # type: ignore[arg-type]
    assert isinstance(got, Refused) and "too old" in got.detail


def test_a_frame_of_an_earlier_connection_fails_in_the_next() -> None:
    d, p = _pair()
    _connect(d, p)
    old = d.seal(p.agent, b"HB:req-1")
    d2 = PeerAuth(KEY, d.agent)  # D restarted under the same name (a new nonce)
    _connect(d2, p)
    assert _send(d2, p, b"HB:req-2") == b"HB:req-2"
    assert p.open(d.agent, old) == b"HB:req-1"  # not a replay: P keeps a few connections
    answer_to_d2 = p.seal(d.agent, b"OK:req-1")  # ... but sends on the one in use
    assert answer_to_d2 is not None
    got = d.open(p.agent, answer_to_d2)  # the old D never verifies it
    assert isinstance(got, Refused)
    assert d2.open(p.agent, answer_to_d2) == b"OK:req-1"


def test_a_replayed_greeting_opens_nothing_the_peer_would_use() -> None:
    d, p = _pair()
    _connect(d, p)
    greeting = d.seal(p.agent, GREETING)
    assert greeting is not None
    assert p.open(d.agent, greeting) == GREETING  # a resent greeting: the same connection
    answer = p.seal(d.agent, ANSWER)
    assert answer is not None and d.open(p.agent, answer) == ANSWER
    assert _send(d, p, b"HB:a") == b"HB:a" and _send(p, d, b"OK:a") == b"OK:a"


def test_an_answer_to_a_greeting_never_sent_is_refused() -> None:
    d, p = _pair()
    p2 = PeerAuth(KEY, "prefill-r0")
    d.expect(p.agent)
    greeting = d.seal(p.agent, GREETING)
    assert greeting is not None
    assert p.open(d.agent, greeting) == GREETING
    stranger = PeerAuth(KEY, d.agent)  # a greeting D never sent: another nonce
    assert p2.open(d.agent, stranger.seal(p.agent, GREETING)) == GREETING  # type: ignore[arg-type]
    forged = p2.seal(d.agent, ANSWER)
    assert forged is not None
    got = d.open(p.agent, forged)
    assert isinstance(got, Refused) and got.reason == "unknown connection"


@pytest.mark.parametrize("data", [FRAME_PREFIX, FRAME_PREFIX + b"x" * 60, FRAME_PREFIX + b"g"])
def test_a_malformed_frame_is_refused(data: bytes) -> None:
    _, p = _pair()
    got = p.open("x", data)
    assert isinstance(got, Refused) and got.reason in ("malformed frame", "bad mac")
    if len(data) < FRAME_OVERHEAD or data[len(FRAME_PREFIX) :][:1] not in b"gam":
        with pytest.raises(MalformedFrame):
            unpack(data)


def test_a_short_key_is_refused_and_the_key_never_printed() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ClusterKey.from_bytes(b"  short \n")
    assert "horse" not in repr(KEY) and KEY.key_id in repr(KEY)
    assert ClusterKey.from_bytes(b"correct horse battery staple 0123456789\n").key_id == KEY.key_id
    assert OTHER.key_id != KEY.key_id


def test_the_window_by_itself() -> None:
    w = ReplayWindow(4)
    for seq in (5, 3, 4, 2):
        assert w.check(seq) is None
        w.accept(seq)
    assert w.check(1) == "too old" and w.check(3) == "replayed" and w.check(6) is None
    w.accept(1 << 40)  # a jump far ahead keeps the memory small
    assert w.check(5) == "too old" and w.check((1 << 40) - 1) is None


@pytest.mark.parametrize("key", [b"k" * 32, b"k" * 64, b"k" * 100])
def test_the_tag_is_hmac_sha256_of_the_context_the_sequence_and_the_payload(key: bytes) -> None:
    import hmac

    from leaseproto.core.mac import Sealer, hmac_sha256

    s = Sealer(key, b"m", "decode-r0", "prefill-r0", b"\x01" * 8, b"\x02" * 8)
    for seq, payload in ((0, b""), (7, b"HB:a,b"), (1 << 40, b"x" * 5000)):
        data = s.context() + seq.to_bytes(8, "big") + payload
        assert s.tag(seq, payload) == hmac.digest(key, data, "sha256")[:16]
        assert hmac_sha256(key, data) == hmac.digest(key, data, "sha256")
