"""A naive model of the wire format: the grammar of spec §3.6 and the splitting rule
of §3.4, read as plainly as possible.

Written from the spec's text, not from :mod:`leaseproto.core.wire` (no fast paths,
no shared helper or constant), so that ``leaseproto prove`` (``proofs/codec.py``)
can hold the real codec to it over bounded sets of inputs, and the tracker's
heartbeat cutter (``proofs/tracking.py``) to its splitting rule. Slow on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "COUNT_MAX",
    "ID_MAX_BYTES",
    "REASONS",
    "decode",
    "encode",
    "id_ok",
    "longest_id",
    "pack_heartbeat",
]

#: a request id's largest size in UTF-8 bytes (§3.3)
ID_MAX_BYTES = 512
#: a transfer-done's largest count, 2^20 (§3.6)
COUNT_MAX = 2**20
#: the reasons of a nack and of a lease-lost (§3.6)
REASONS = ("expired", "aborted", "transferred", "unknown")
_STEMS = ("HB", "AB", "OK", "NK", "LL")


def id_ok(rid: object) -> bool:
    """§3.3: a non-empty str of at most 512 UTF-8 bytes, with no ``,`` and no control
    character (U+0000-U+001F, U+007F), not beginning with a reserved prefix nor equal
    to one without its colon."""
    if not isinstance(rid, str) or rid == "":
        return False
    try:
        size = len(rid.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8 form
        return False
    if size > ID_MAX_BYTES:
        return False
    for ch in rid:
        if ch == "," or ord(ch) <= 0x1F or ord(ch) == 0x7F:
            return False
    return not any(rid == stem or rid.startswith(stem + ":") for stem in _STEMS)


def longest_id(max_notification_bytes: int) -> int:
    """Rule C7: the longest id a message can carry when the longest message naming one
    id, ``NK:transferred:<id>``, must fit in one notification."""
    return min(ID_MAX_BYTES, max_notification_bytes - len("NK:transferred:"))


def pack_heartbeat(ids: Iterable[str], max_bytes: int) -> list[bytes]:
    """§3.4: ``HB:`` and as many whole ids as fit, message after message, every id
    once (the first time it is named), in order.

    Raises:
        ValueError: no room for an id after ``HB:``, or an id that does not fit in a
            message on its own.
    """
    if max_bytes - 3 < 1:
        raise ValueError("no room for an id")
    once: list[str] = []
    for rid in ids:
        if rid not in once:
            once.append(rid)
    out: list[bytes] = []
    current: list[bytes] = []
    for rid in once:
        raw = rid.encode("utf-8")
        if 3 + len(raw) > max_bytes:
            raise ValueError(f"id {rid!r} does not fit in one message")
        if current and len(b"HB:" + b",".join([*current, raw])) > max_bytes:
            out.append(b"HB:" + b",".join(current))
            current = []
        current.append(raw)
    if current:
        out.append(b"HB:" + b",".join(current))
    return out


def encode(kind: str, rid: str, extra: Any = None) -> bytes:
    """One message of ``kind`` (``transfer_done`` with count ``extra``, ``abort``,
    ``ok``, ``nack`` and ``lease_lost`` with reason ``extra``), per §3.2.

    Raises:
        ValueError: an invalid id, count or reason.
    """
    if not id_ok(rid):
        raise ValueError(f"invalid id {rid!r}")
    raw = rid.encode("utf-8")
    if kind == "transfer_done":
        if type(extra) is not int or not 1 <= extra <= COUNT_MAX:
            raise ValueError(f"bad count {extra!r}")
        return raw + b":" + str(extra).encode("ascii")
    if kind in ("nack", "lease_lost"):
        if extra not in REASONS:
            raise ValueError(f"bad reason {extra!r}")
        prefix = b"NK:" if kind == "nack" else b"LL:"
        return prefix + str(extra).encode("ascii") + b":" + raw
    return {"abort": b"AB:", "ok": b"OK:"}[kind] + raw


def decode(payload: bytes) -> tuple[Any, ...] | None:
    """The message ``payload`` is, as ``(kind, ...)``: ``("heartbeat", ids)``,
    ``("abort", id)``, ``("ok", id)``, ``("nack", id, reason)``,
    ``("lease_lost", id, reason)``, ``("transfer_done", id, count)``; ``None`` when it
    is malformed (§3.5: not UTF-8, an invalid or empty id, a bad count or reason, no
    form at all)."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    for prefix, kind in (("AB:", "abort"), ("OK:", "ok")):
        if text.startswith(prefix):
            rid = text[3:]
            return (kind, rid) if id_ok(rid) else None
    if text.startswith("HB:"):
        ids = text[3:].split(",")
        return ("heartbeat", tuple(ids)) if all(id_ok(r) for r in ids) else None
    for prefix, kind in (("NK:", "nack"), ("LL:", "lease_lost")):
        if text.startswith(prefix):
            rest = text[3:]
            if ":" not in rest:
                return None
            reason, rid = rest[: rest.index(":")], rest[rest.index(":") + 1 :]
            return (kind, rid, reason) if reason in REASONS and id_ok(rid) else None
    if ":" not in text:
        return None
    cut = len(text) - 1 - text[::-1].index(":")  # the last ':'
    rid, count = text[:cut], text[cut + 1 :]
    if not 1 <= len(count) <= 7 or any(c not in "0123456789" for c in count):
        return None
    if not 1 <= int(count) <= COUNT_MAX or not id_ok(rid):
        return None
    return ("transfer_done", rid, int(count))
