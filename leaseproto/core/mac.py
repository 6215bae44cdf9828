"""Authenticated notifications (spec §3.6, §10.3): the cluster key, the frame
that carries a MAC, and the anti-replay window.

With a cluster key, leaseproto's own notifications between two peers that
both greeted with it travel inside a **frame**::

    b"leaseproto/1,mac," kind(1) nonce_d(8) nonce_p(8) seq(8, big-endian) tag(16) payload

``kind`` is ``g`` (D's greeting, ``HB:leaseproto/1``; ``nonce_p`` is zero),
``a`` (P's answer to it, ``OK:leaseproto/1``) or ``m`` (any other message).
``nonce_d`` is chosen by the greeting's sender and ``nonce_p`` by the one
answering it: together they name one **connection**, and a receiver knows
which of its own nonces are current, so a frame of an earlier connection never
verifies. ``seq`` numbers the frames of one direction of one connection; the
receiver keeps an IPsec-style sliding window (:class:`ReplayWindow`), so a
reordered frame is accepted once and a replayed one never. ``tag`` is the
first 16 bytes of HMAC-SHA256, keyed with a key derived from the cluster key,
over a fixed label, the kind, the sender's and the receiver's agent names
(length-prefixed), both nonces, ``seq`` and the payload.

The prefix cannot begin a message of §3.6 (a request id has no ``,``; a
heartbeat begins ``HB:``), so a frame that reached a peer without the key
would be malformed there, never read as a transfer-done. Nothing here reads a
clock or does I/O: the key's bytes and the nonces are handed in.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import RemoteProtocolError

__all__ = [
    "FRAME_OVERHEAD",
    "FRAME_PREFIX",
    "KIND_ANSWER",
    "KIND_GREETING",
    "KIND_MESSAGE",
    "MAC_BYTES",
    "MIN_KEY_BYTES",
    "NONCE_BYTES",
    "REPLAY_WINDOW",
    "ClusterKey",
    "Frame",
    "MalformedFrame",
    "ReplayWindow",
    "Sealer",
    "hmac_sha256",
    "is_frame",
    "unpack",
]

FRAME_PREFIX = b"leaseproto/1,mac,"
KIND_GREETING = b"g"
KIND_ANSWER = b"a"
KIND_MESSAGE = b"m"
_KINDS = frozenset((KIND_GREETING, KIND_ANSWER, KIND_MESSAGE))
NONCE_BYTES = 8
_SEQ_BYTES = 8
MAC_BYTES = 16
_HEAD = len(FRAME_PREFIX) + 1 + 2 * NONCE_BYTES + _SEQ_BYTES
#: Bytes a frame adds to the message it carries.
FRAME_OVERHEAD = _HEAD + MAC_BYTES
_FIELDS = struct.Struct(f">c{NONCE_BYTES}s{NONCE_BYTES}sQ{MAC_BYTES}s")
assert _FIELDS.size + len(FRAME_PREFIX) == FRAME_OVERHEAD
#: Sequence numbers behind the highest one seen that are still accepted once.
REPLAY_WINDOW = 1024
#: Shortest cluster key accepted, bytes (after surrounding whitespace is stripped).
MIN_KEY_BYTES = 16
_ZERO_NONCE = bytes(NONCE_BYTES)
_LABEL = b"leaseproto/1 notification mac\x00"


class MalformedFrame(RemoteProtocolError):
    """Bytes that begin like a frame but are not one (too short, unknown kind)."""


@dataclass(frozen=True, repr=False)
class ClusterKey:
    """Keys derived from the operator's cluster key (never the raw bytes)."""

    #: HMAC key of the notification frames
    mac_key: bytes
    #: 32 bytes from which the request plane's CURVE key pair is made
    curve_seed: bytes
    #: 16 hex digits that name the key without revealing it (P advertises it)
    key_id: str

    @classmethod
    def from_bytes(cls, raw: bytes) -> ClusterKey:
        """From the key file's contents. Raises ``ValueError`` when too short."""
        material = raw.strip()
        if len(material) < MIN_KEY_BYTES:
            raise ValueError(
                f"a cluster key must hold at least {MIN_KEY_BYTES} bytes, got {len(material)}"
            )

        def derive(label: bytes) -> bytes:
            return hmac.new(material, b"leaseproto/1 " + label, hashlib.sha256).digest()

        return cls(derive(b"mac"), derive(b"curve"), derive(b"key id")[:8].hex())

    def __repr__(self) -> str:
        return f"ClusterKey(key_id={self.key_id!r})"


class Frame(NamedTuple):
    """One unpacked frame (not yet verified; a tuple: built once per message)."""

    kind: bytes
    nonce_d: bytes
    nonce_p: bytes
    seq: int
    tag: bytes
    payload: bytes


def is_frame(data: bytes) -> bool:
    return data.startswith(FRAME_PREFIX)


def unpack(data: bytes) -> Frame:
    """Split a frame into its fields. Raises :class:`MalformedFrame`."""
    if not data.startswith(FRAME_PREFIX) or len(data) < FRAME_OVERHEAD:
        raise MalformedFrame(f"not a leaseproto frame ({len(data)} bytes)")
    kind, nonce_d, nonce_p, seq, tag = _FIELDS.unpack_from(data, len(FRAME_PREFIX))
    if kind not in _KINDS:
        raise MalformedFrame(f"unknown frame kind {kind!r}")
    return Frame(kind, nonce_d, nonce_p, seq, tag, data[FRAME_OVERHEAD:])


def _name(agent: str) -> bytes:
    raw = agent.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"agent name of {len(raw)} bytes is too long for a frame")
    return len(raw).to_bytes(2, "big") + raw


_BLOCK = hashlib.sha256().block_size
_IPAD = bytes(0x36 for _ in range(_BLOCK))
_OPAD = bytes(0x5C for _ in range(_BLOCK))


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) as :class:`Sealer` computes it, in one call
    (``tests/test_mac.py`` shows it equal to :func:`hmac.digest`)."""
    k = key if len(key) <= _BLOCK else hashlib.sha256(key).digest()
    k = k.ljust(_BLOCK, b"\0")
    inner = hashlib.sha256(_xor(k, _IPAD) + data).digest()
    return hashlib.sha256(_xor(k, _OPAD) + inner).digest()


@dataclass
class Sealer:
    """Seals and checks the frames of one direction of one connection.

    HMAC-SHA256 is computed from its definition (RFC 2104) on ``hashlib``
    states: the inner hash over the padded key, the label, the names and the
    nonces, and the outer hash over the padded key, are computed once, so a
    frame costs two hash copies (about half of what ``hmac.HMAC.copy`` costs;
    ``tests/test_mac.py`` shows the tags equal to :mod:`hmac`'s)."""

    key: bytes
    kind: bytes
    sender: str
    receiver: str
    nonce_d: bytes
    nonce_p: bytes = _ZERO_NONCE
    _inner: Any = field(init=False, repr=False)
    _outer: Any = field(init=False, repr=False)
    _head: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.nonce_d) != NONCE_BYTES or len(self.nonce_p) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
        k = self.key if len(self.key) <= _BLOCK else hashlib.sha256(self.key).digest()
        k = k.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(_xor(k, _IPAD) + self.context())
        self._outer = hashlib.sha256(_xor(k, _OPAD))
        self._head = FRAME_PREFIX + self.kind + self.nonce_d + self.nonce_p

    def context(self) -> bytes:
        """What the MAC covers before the sequence number and the payload."""
        return (
            _LABEL
            + self.kind
            + _name(self.sender)
            + _name(self.receiver)
            + self.nonce_d
            + self.nonce_p
        )

    def tag(self, seq: int, payload: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(seq.to_bytes(_SEQ_BYTES, "big"))
        inner.update(payload)
        outer = self._outer.copy()
        outer.update(inner.digest())
        tag: bytes = outer.digest()[:MAC_BYTES]
        return tag

    def seal(self, seq: int, payload: bytes) -> bytes:
        return self._head + seq.to_bytes(_SEQ_BYTES, "big") + self.tag(seq, payload) + payload

    def verify(self, frame: Frame) -> bool:
        """Whether ``frame`` was sealed by a holder of the key for this
        direction, kind and connection (constant-time comparison)."""
        return (
            frame.kind == self.kind
            and frame.nonce_d == self.nonce_d
            and frame.nonce_p == self.nonce_p
            and hmac.compare_digest(frame.tag, self.tag(frame.seq, frame.payload))
        )


class ReplayWindow:
    """The sequence numbers of one direction of one connection seen so far:
    the highest, and which of the :data:`REPLAY_WINDOW` below it (RFC 4303
    §3.4.3). :meth:`check` before the MAC is verified, :meth:`accept` after."""

    def __init__(self, size: int = REPLAY_WINDOW) -> None:
        if size < 1:
            raise ValueError("a replay window holds at least one sequence number")
        self.size = size
        self._mask = (1 << size) - 1
        self.top = -1
        self._bits = 0  # bit i: top - i was seen

    def check(self, seq: int) -> str | None:
        """Why ``seq`` must be refused (``"replayed"``, ``"too old"``), or None."""
        if seq > self.top:
            return None
        behind = self.top - seq
        if behind >= self.size:
            return "too old"
        return "replayed" if self._bits >> behind & 1 else None

    def accept(self, seq: int) -> None:
        """Mark ``seq`` seen (it passed :meth:`check` and the MAC)."""
        if seq > self.top:
            shift = seq - self.top
            kept = (self._bits << shift) & self._mask if shift < self.size else 0
            self._bits = kept | 1
            self.top = seq
        else:
            self._bits |= 1 << (self.top - seq)
