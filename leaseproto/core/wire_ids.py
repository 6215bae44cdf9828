"""Request ids on the wire (spec §3.3, "Request ids"), and the message prefixes
that no id may take.

An id is a non-empty string of at most :data:`MAX_ID_BYTES` UTF-8 bytes, with no
``,`` (the heartbeat separator) and no control character, that neither begins with
a reserved prefix (``HB:``, ``AB:``, ``OK:``, ``NK:``, ``LL:``) nor equals one
without its colon. :func:`id_problem` says why an id breaks these rules (``None``:
it does not) and :func:`check_id` raises with that reason or returns the id's
bytes; :func:`plain_id` (one id) and :func:`_plain_ids` (every id of a heartbeat
at once) are quick sufficient checks for the common case that send anything else
to the full one.

The prefixes are defined here because the id rules are stated in terms of them;
:mod:`leaseproto.core.wire` frames the messages with them and re-exports them with
this module's other public names.
"""

from __future__ import annotations

import re

__all__ = [
    "ABORT_PREFIX",
    "HEARTBEAT_PREFIX",
    "LEASE_LOST_PREFIX",
    "MAX_ID_BYTES",
    "NACK_PREFIX",
    "OK_PREFIX",
    "RESERVED_PREFIXES",
    "check_id",
    "plain_id",
]

HEARTBEAT_PREFIX = b"HB:"
ABORT_PREFIX = b"AB:"
OK_PREFIX = b"OK:"
NACK_PREFIX = b"NK:"
LEASE_LOST_PREFIX = b"LL:"
RESERVED_PREFIXES = (HEARTBEAT_PREFIX, ABORT_PREFIX, OK_PREFIX, NACK_PREFIX, LEASE_LOST_PREFIX)
_RESERVED = RESERVED_PREFIXES
#: C0 control characters and DEL, which no id may contain.
_CONTROL = re.compile("[\x00-\x1f\x7f]")
#: Longest request id, in UTF-8 bytes.
MAX_ID_BYTES = 512
# The reserved prefixes as text, for _plain_ids; each ends with ":" (checked here), so
# an id with no ":" is reserved only when it equals a stem ("HB"), two characters long.
assert all(p.endswith(b":") for p in RESERVED_PREFIXES)
_RESERVED_TEXT = tuple(p.decode() for p in RESERVED_PREFIXES)
_STEM_LEN = max(len(p) - 1 for p in RESERVED_PREFIXES)
#: The bytes _CONTROL matches: in UTF-8 each is one byte and no other character's
#: encoding contains one, so deleting them from a payload finds any at C speed.
_CONTROL_BYTES = bytes([*range(0x20), 0x7F])


def id_problem(req_id: object) -> str | None:
    """Why ``req_id`` cannot go on the wire, or ``None`` when it can."""
    if not isinstance(req_id, str):
        return f"request id must be a str, got {type(req_id).__name__}"
    if not req_id:
        return "request id is empty"
    if "," in req_id:
        return f"request id {req_id!r} contains ','"
    if _CONTROL.search(req_id) is not None:
        return f"request id {req_id!r} contains a control character"
    try:
        raw = req_id.encode("utf-8")
    except UnicodeEncodeError:
        return f"request id {req_id!r} is not encodable as UTF-8"
    if len(raw) > MAX_ID_BYTES:
        return f"request id is {len(raw)} bytes, more than {MAX_ID_BYTES}"
    if (raw + b":").startswith(_RESERVED):
        # "HB" is refused too: its transfer-done "HB:1" would read as a heartbeat
        return f"request id {req_id!r} collides with a reserved prefix"
    return None


def plain_id(req_id: object, max_bytes: int = MAX_ID_BYTES) -> bool:
    """True only for an id :func:`id_problem` accepts, of at most ``max_bytes``
    bytes: a quick sufficient check (ASCII, printable, longer than a reserved
    stem, no ``,``, no reserved prefix) for callers that validate every id they
    are given; False means "ask :func:`id_problem`", not "invalid"."""
    return (
        type(req_id) is str
        and _STEM_LEN < len(req_id) <= max_bytes
        and len(req_id) <= MAX_ID_BYTES
        and req_id.isascii()
        and req_id.isprintable()
        and "," not in req_id
        and (":" not in req_id or not req_id.startswith(_RESERVED_TEXT))
    )


def _plain_ids(data: bytes, text: str, skip: int = len(HEARTBEAT_PREFIX)) -> list[str] | None:
    """The ids of a heartbeat (``data``, decoded: ``text`` without its prefix)
    when checks over the whole payload show each passes :func:`id_problem`: no
    control character, ASCII (so its length is its size, at most
    :data:`MAX_ID_BYTES`), none empty or as short as a reserved stem, none with a
    reserved prefix. ``None`` sends the caller to the per-id checks, which decide
    and word the error exactly as before; ``tests/test_wire.py`` checks both
    decide alike."""
    if len(data) - len(text) != skip:  # not ASCII (``skip``: the prefix's bytes in data)
        return None
    if len(data.translate(None, _CONTROL_BYTES)) != len(data):
        return None
    ids = text.split(",")
    lens = list(map(len, ids))
    if min(lens) <= _STEM_LEN or max(lens) > MAX_ID_BYTES:
        return None
    if ":" in text:
        starts = str.startswith
        for rid in ids:
            if starts(rid, _RESERVED_TEXT):
                return None
    return ids


def check_id(req_id: str) -> bytes:
    """The id's UTF-8 bytes.

    Raises:
        ValueError: empty, contains ``,`` or a control character, longer than
            :data:`MAX_ID_BYTES`, or starts with a reserved prefix (``HB:``,
            ``AB:``, ``OK:``, ``NK:``, ``LL:``) or equals one without its colon.
    """
    problem = id_problem(req_id)
    if problem is not None:
        raise ValueError(problem)
    return req_id.encode("utf-8")
