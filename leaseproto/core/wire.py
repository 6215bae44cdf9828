"""Wire formats carried in NIXL notifications (spec §3, "Messages").

Byte-compatible with vLLM's NIXL connector:

* heartbeat, D→P: ``b"HB:" + b",".join(ids)`` (P's request ids, UTF-8);
* transfer-done, D→P: ``b"<req_id>:<n>"``, split on the last ``:``; ``n`` is
  the number of D workers that will notify this P worker (the lease's readers).

Our own messages, each with a prefix vLLM never sends, and sent only to a peer
that advertised :data:`CAPABILITY`:

* abort, D→P: ``b"AB:" + req_id`` (D rejected or cancelled the request);
* verdict OK, P→D: ``b"OK:" + req_id`` (the transfer-done was handled while
  the lease was live: what D read is the blocks P granted);
* verdict NK, P→D: ``b"NK:" + reason + b":" + req_id`` (handled after the lease
  ended, or with no lease known: the reader must discard what it read);
* lease lost, P→D: ``b"LL:" + reason + b":" + req_id`` (advisory answer to a
  heartbeat naming a lease P no longer holds; never overrides a verdict).

:func:`decode` returns a typed message or raises :class:`MalformedMessage`
and nothing else, whatever the bytes. :func:`verdict` decides the verdict for
what :meth:`~leaseproto.LeaseTable.transfer_done` returned (invariant I13).

Which request ids may go on the wire (spec §3.3: :func:`check_id`,
:func:`plain_id`, :data:`MAX_ID_BYTES`) is defined in :mod:`leaseproto.core.wire_ids`,
with the message prefixes (:data:`HEARTBEAT_PREFIX`...) that no id may begin with;
this module re-exports them.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

from . import rules as R
from .errors import LocalProtocolError, RemoteProtocolError
from .events import LateTransfer, Release, ReleaseReason, TransferCounted
from .wire_ids import (
    ABORT_PREFIX,
    HEARTBEAT_PREFIX,
    LEASE_LOST_PREFIX,
    MAX_ID_BYTES,
    NACK_PREFIX,
    OK_PREFIX,
    RESERVED_PREFIXES,
    _plain_ids,
    check_id,
    id_problem,
    plain_id,
)

__all__ = [
    "ABORT_PREFIX",
    "CAPABILITY",
    "HEARTBEAT_PREFIX",
    "LEASE_LOST_PREFIX",
    "LOST_REASONS",
    "MAX_COUNT",
    "MAX_ID_BYTES",
    "NACK_PREFIX",
    "NACK_REASONS",
    "OK_PREFIX",
    "RESERVED_PREFIXES",
    "VERDICT_OVERHEAD",
    "Abort",
    "Heartbeat",
    "LeaseLost",
    "MalformedMessage",
    "Message",
    "Nack",
    "Ok",
    "TransferDone",
    "Verdict",
    "check_id",
    "decode",
    "encode",
    "encode_abort",
    "encode_heartbeat",
    "encode_lease_lost",
    "encode_nack",
    "encode_ok",
    "encode_transfer_done",
    "lease_lost",
    "plain_id",
    "verdict",
]

#: What a peer advertises to say it understands AB, OK, NK and LL.
CAPABILITY = "leaseproto/1"
#: Largest count a transfer-done may carry.
MAX_COUNT = 1 << 20
#: Why a read is refused: the lease had ended (how), or P knows no lease by that id.
NACK_REASONS = ("expired", "aborted", "transferred", "unknown")
#: Why P no longer holds a lease a heartbeat named (same words).
LOST_REASONS = NACK_REASONS
#: Bytes a message adds to its id at most (``NK:transferred:``), so an id of
#: ``max_notification_bytes - VERDICT_OVERHEAD`` bytes fits in every message.
VERDICT_OVERHEAD = len(NACK_PREFIX) + max(map(len, NACK_REASONS)) + 1


class MalformedMessage(RemoteProtocolError, ValueError):
    """A notification that is not a valid message. Count it and drop it."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Renew P's leases for these request ids."""

    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TransferDone:
    """D finished reading ``req_id``'s blocks; ``count`` is vLLM's ``n``."""

    req_id: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Abort:
    """D will never read ``req_id``: free its blocks now."""

    req_id: str


@dataclass(frozen=True, slots=True)
class Ok:
    """Verdict: P handled D's transfer-done while the lease was live, so the
    bytes D read are the blocks P granted. D may use them."""

    req_id: str


@dataclass(frozen=True, slots=True)
class Nack:
    """Verdict: P handled D's transfer-done after the lease ended (``reason``:
    expired, aborted, transferred) or knows no lease by that id (unknown):
    what D read may come from reused blocks and must be discarded."""

    req_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """Advisory: a heartbeat named a lease P no longer holds (``reason``). D may
    give up on the read early; a verdict for the same read always wins."""

    req_id: str
    reason: str


Verdict = Union[Ok, Nack]  # noqa: UP007 - runtime alias, py3.10
Message = Union[Heartbeat, TransferDone, Abort, Ok, Nack, LeaseLost]  # noqa: UP007


def encode_heartbeat(ids: Iterable[str], *, max_bytes: int = 4096) -> list[bytes]:
    """Heartbeat messages naming every id exactly once, none over ``max_bytes``.

    Ids keep their order; duplicates are sent once. No ids, no messages.

    Raises:
        ValueError: an id is invalid (:func:`check_id`) or too long to fit in
            one message, or ``max_bytes`` leaves no room for an id.
    """
    room = max_bytes - len(HEARTBEAT_PREFIX)
    if room < 1:
        raise ValueError(f"max_bytes={max_bytes} leaves no room for an id")
    items = list(ids)
    fast = _encode_plain(items, room)
    return fast if fast is not None else _encode_each(items, room, max_bytes)


def _encode_plain(items: list[str], room: int) -> list[bytes] | None:
    """:func:`encode_heartbeat` for ids that the whole-payload check of
    :func:`_plain_ids` passes and that each fit in ``room``: joined and
    encoded once, cut greedily at the same places as :func:`_encode_each`
    (cumulative sizes, one bisect per message). ``None``: use that one."""
    try:
        uniq = list(dict.fromkeys(items))
        text = ",".join(uniq)
    except TypeError:  # an unhashable or non-str id: _encode_each says which
        return None
    if not uniq:
        return []
    data = text.encode("utf-8", "surrogatepass")
    plain = _plain_ids(data, text, 0)
    if plain is None or len(plain) != len(uniq) or max(map(len, uniq)) > room:
        return None
    # ends[k]: the offset just past id k and its comma; a message of ids i..j-1
    # spans data[ends[i-1] : ends[j-1] - 1], and fits when that is <= room bytes
    ends = list(itertools.accumulate(len(rid) + 1 for rid in uniq))
    out: list[bytes] = []
    start = 0
    n = len(ends)
    k = 0
    while k < n:
        j = bisect.bisect_right(ends, start + room + 1, k) - 1  # last id that fits
        out.append(HEARTBEAT_PREFIX + data[start : ends[j] - 1])
        start = ends[j]
        k = j + 1
    return out


def _encode_each(items: list[str], room: int, max_bytes: int) -> list[bytes]:
    out: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    seen: set[str] = set()
    for rid in items:
        if rid in seen:
            continue
        raw = check_id(rid)
        seen.add(rid)
        if len(raw) > room:
            raise ValueError(
                f"request id of {len(raw)} bytes does not fit in a {max_bytes}-byte heartbeat"
            )
        extra = len(raw) + (1 if parts else 0)
        if size + extra > room:
            out.append(HEARTBEAT_PREFIX + b",".join(parts))
            parts, size, extra = [], 0, len(raw)
        parts.append(raw)
        size += extra
    if parts:
        out.append(HEARTBEAT_PREFIX + b",".join(parts))
    return out


def encode_transfer_done(req_id: str, count: int = 1) -> bytes:
    """``b"<req_id>:<count>"`` (vLLM's format)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count={count!r} must be an integer in [1, {MAX_COUNT}]")
    return check_id(req_id) + b":" + str(count).encode()


def encode_abort(req_id: str) -> bytes:
    return ABORT_PREFIX + check_id(req_id)


def encode_ok(req_id: str) -> bytes:
    return OK_PREFIX + check_id(req_id)


def encode_nack(req_id: str, reason: str) -> bytes:
    if reason not in NACK_REASONS:
        raise ValueError(f"reason={reason!r} must be one of {NACK_REASONS}")
    return NACK_PREFIX + reason.encode() + b":" + check_id(req_id)


def encode_lease_lost(req_id: str, reason: str) -> bytes:
    if reason not in LOST_REASONS:
        raise ValueError(f"reason={reason!r} must be one of {LOST_REASONS}")
    return LEASE_LOST_PREFIX + reason.encode() + b":" + check_id(req_id)


def encode(message: Message, *, max_bytes: int = 4096) -> list[bytes]:
    """Any message as notification payloads (several only for a long heartbeat)."""
    if isinstance(message, Heartbeat):
        return encode_heartbeat(message.ids, max_bytes=max_bytes)
    if isinstance(message, TransferDone):
        return [encode_transfer_done(message.req_id, message.count)]
    if isinstance(message, Abort):
        return [encode_abort(message.req_id)]
    if isinstance(message, Ok):
        return [encode_ok(message.req_id)]
    if isinstance(message, Nack):
        return [encode_nack(message.req_id, message.reason)]
    if isinstance(message, LeaseLost):
        return [encode_lease_lost(message.req_id, message.reason)]
    raise TypeError(f"not a message: {message!r}")


def _valid_id(raw: str, msg: object) -> str:
    problem = id_problem(raw)
    if problem is not None:
        raise MalformedMessage(f"{problem} in {msg!r}")
    return raw


def decode(msg: bytes) -> Message:
    """Parse one notification.

    Raises:
        MalformedMessage: anything that is not a valid message: not bytes,
            not UTF-8, an empty or invalid id, a bad count, an unknown form.
    """
    if not isinstance(msg, (bytes, bytearray, memoryview)):
        raise MalformedMessage(f"notification must be bytes, got {type(msg).__name__}")
    data = bytes(msg)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"notification is not UTF-8: {data[:64]!r}") from exc
    if data.startswith(HEARTBEAT_PREFIX):
        body = text[len(HEARTBEAT_PREFIX) :]
        ids = _plain_ids(data, body)
        if ids is not None:
            return Heartbeat(tuple(ids))
        return Heartbeat(tuple(_valid_id(part, data) for part in body.split(",")))
    if data.startswith(ABORT_PREFIX):
        return Abort(_valid_id(text[len(ABORT_PREFIX) :], data))
    if data.startswith(OK_PREFIX):
        return Ok(_valid_id(text[len(OK_PREFIX) :], data))
    if data.startswith(NACK_PREFIX):
        reason, sep, rid = text[len(NACK_PREFIX) :].partition(":")
        if not sep or reason not in NACK_REASONS:
            raise MalformedMessage(f"bad nack {data[:64]!r}")
        return Nack(_valid_id(rid, data), reason)
    if data.startswith(LEASE_LOST_PREFIX):
        reason, sep, rid = text[len(LEASE_LOST_PREFIX) :].partition(":")
        if not sep or reason not in LOST_REASONS:
            raise MalformedMessage(f"bad lease-lost {data[:64]!r}")
        return LeaseLost(_valid_id(rid, data), reason)
    rid, sep, count = text.rpartition(":")
    if not sep:
        raise MalformedMessage(f"unknown message {data[:64]!r}")
    if not (count.isascii() and count.isdigit()) or len(count) > 7:
        raise MalformedMessage(f"bad transfer-done count in {data[:64]!r}")
    n = int(count)
    if not 1 <= n <= MAX_COUNT:
        raise MalformedMessage(f"transfer-done count {n} out of range in {data[:64]!r}")
    return TransferDone(_valid_id(rid, data), n)


# -- deciding what P answers (I13) ---------------------------------------------------------
_ENDED_STATE = {
    ReleaseReason.TRANSFERRED: R.TRANSFERRED,
    ReleaseReason.EXPIRED: R.EXPIRED,
    ReleaseReason.ABORTED: R.ABORTED,
}
_NACK_REASON = {state: reason.value for reason, state in _ENDED_STATE.items()}


def verdict(req_id: str, result: Release | TransferCounted | LateTransfer | None) -> Verdict:
    """The verdict P sends for one transfer-done of ``req_id``, given what
    :meth:`~leaseproto.LeaseTable.transfer_done` returned for it (I13).

    * :class:`Release` (the last reader) or :class:`TransferCounted` (a partial
      count): the lease was live when the notification was handled: ``OK``;
    * :class:`LateTransfer`: the lease had ended: ``NK`` with how it ended
      (``expired``, ``aborted``, ``transferred``);
    * ``None`` (no lease and no tombstone: the notification was staged for a
      grant that may never come): ``NK`` ``unknown``. P cannot vouch for blocks
      it holds no lease on, so the reader recomputes.

    Raises:
        LocalProtocolError: ``result`` names another request, or is not one of
            those.
    """
    if result is None:
        state = R.ABSENT
    elif isinstance(result, (Release, TransferCounted)):
        state = R.GRANTED  # handled while the lease was live
    elif isinstance(result, LateTransfer):
        state = _ENDED_STATE[result.ended]
    else:
        raise LocalProtocolError(f"not a transfer-done result: {result!r}")
    if result is not None and result.req_id != req_id:
        raise LocalProtocolError(f"result for {result.req_id!r} given as the verdict of {req_id!r}")
    if R.transfer_verdict_ok(state):
        return Ok(req_id)
    return Nack(req_id, _NACK_REASON.get(state, "unknown"))


def lease_lost(req_id: str, reason: ReleaseReason | None) -> LeaseLost:
    """The advisory answer to a heartbeat naming ``req_id``, which P no longer
    holds: ``reason`` is :meth:`~leaseproto.LeaseTable.lost_reason` (``None``:
    P knows no lease by that id)."""
    return LeaseLost(req_id, "unknown" if reason is None else reason.value)
