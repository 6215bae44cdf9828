"""Argument checks shared by the core's inputs (spec §10: local misuse).

Each raises :class:`LocalProtocolError` naming the argument and leaves the
caller's state untouched (call them before changing anything).
"""

from __future__ import annotations

import math

from .errors import LocalProtocolError
from .wire_ids import id_problem, plain_id

__all__ = [
    "FIRST_NOW",
    "advance",
    "check_count",
    "check_finite",
    "check_now",
    "check_positive",
    "check_wire_id",
]

#: The ``last`` to start a clock with: every finite ``now`` is at or after it.
FIRST_NOW = -math.inf
_INF = math.inf


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_finite(name: str, value: object) -> float:
    """``value`` as a float, when it is a finite number (not a bool)."""
    if not _is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise LocalProtocolError(f"{name}={value!r} must be a finite number")
    return float(value)  # type: ignore[arg-type]


def check_positive(name: str, value: object) -> float:
    """``value`` as a float, when it is a positive finite number of seconds."""
    if not _is_number(value) or not (math.isfinite(value) and value > 0):  # type: ignore[operator,arg-type]
        raise LocalProtocolError(f"{name}={value!r} must be a positive finite number of seconds")
    return float(value)  # type: ignore[arg-type]


def check_now(now: object, last: float) -> float:
    """``now`` as a float, when it is finite and not before ``last``."""
    value = check_finite("now", now)
    if value < last:
        raise LocalProtocolError(f"now={now!r} went backwards (last seen {last!r})")
    return value


def advance(last: float, now: float) -> float:
    """The clock's new reading: ``now``, when it is finite and not before
    ``last`` (the core's inputs call it first, so a refused ``now`` changes
    nothing). One chained comparison on the good path; NaN fails it too, and
    the two identity tests refuse a bool (an int, which the comparison
    takes)."""
    try:
        ok = last <= now < _INF and now > -_INF and now is not True and now is not False
    except TypeError:
        ok = False
    if not ok:
        check_now(now, last)
        raise LocalProtocolError(f"now={now!r} is not a time")
    return now


def check_count(name: str, value: object, maximum: int) -> int:
    """``value``, when it is an integer (not a bool) in ``[1, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise LocalProtocolError(f"{name}={value!r} must be an integer in [1, {maximum}]")
    return value


def check_wire_id(req_id: object, max_bytes: int) -> str:
    """``req_id``, when every message naming it can be sent: a valid id
    (:func:`leaseproto.wire.check_id`) of at most ``max_bytes`` UTF-8 bytes
    (``LeaseConfig.max_id_bytes``, rule C7)."""
    if plain_id(req_id, max_bytes):  # the common case, decided at C speed
        return req_id  # type: ignore[return-value]
    problem = id_problem(req_id)
    if problem is None and isinstance(req_id, str):
        size = len(req_id.encode("utf-8"))
        if size > max_bytes:
            problem = (
                f"request id is {size} bytes, more than max_id_bytes={max_bytes} "
                "(rule C7: every message naming it must fit in max_notification_bytes)"
            )
    if problem is not None or not isinstance(req_id, str):
        raise LocalProtocolError(problem or f"request id {req_id!r} is not a str")
    return req_id
