"""What the core hands back to its caller: small frozen value objects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from operator import attrgetter
from typing import Any, cast

__all__ = [
    "LateTransfer",
    "Release",
    "ReleaseReason",
    "TransferCounted",
    "make_release",
    "make_releases",
]


class ReleaseReason(Enum):
    """Why a lease ended."""

    #: Every expected transfer-done notification arrived.
    TRANSFERRED = "transferred"
    #: The deadline passed without renewal.
    EXPIRED = "expired"
    #: D aborted the request (notify-only abort).
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Release:
    """Free this request's blocks now.

    Attributes:
        req_id: P's request id.
        reason: why the lease ended.
        at: the ``now`` of the call that released it.
        granted_at: when the lease was granted.
        deadline: the lease's deadline when it ended.
        last_renewal: ``now`` of the last heartbeat that renewed it, or ``None``.
    """

    req_id: str
    reason: ReleaseReason
    at: float
    granted_at: float = field(default=0.0, kw_only=True)
    deadline: float = field(default=0.0, kw_only=True)
    last_renewal: float | None = field(default=None, kw_only=True)


class _Building:
    """A :class:`Release` while its fields are set: the same slots, not frozen, so
    each field is one plain store; then the object becomes a ``Release``
    (``__class__`` assignment between classes of one layout). A third of the
    cost of setting the frozen slots one by one, a fifth of the constructor's."""

    __slots__ = Release.__slots__

    def __init__(  # noqa: PLR0917 - the fields, in order
        self,
        req_id: str,
        reason: ReleaseReason,
        at: float,
        granted_at: float,
        deadline: float,
        last_renewal: float | None,
    ) -> None:
        self.req_id = req_id
        self.reason = reason
        self.at = at
        self.granted_at = granted_at
        self.deadline = deadline
        self.last_renewal = last_renewal
        self.__class__ = Release  # type: ignore[assignment]


#: ``make_release(req_id, reason, at, granted_at, deadline, last_renewal)``:
#: ``Release(req_id, reason, at, granted_at=..., deadline=..., last_renewal=...)``
#: built without the frozen ``__init__`` (for ``expire`` releasing thousands at
#: once); ``tests/test_specialise.py`` checks it equals the constructor's.
make_release = cast(
    Callable[[str, ReleaseReason, float, float, float, "float | None"], Release], _Building
)


_fields = attrgetter("req_id", "granted_at", "deadline", "last_renewal")


def make_releases(leases: Sequence[Any], reason: ReleaseReason, at: float) -> list[Release]:
    """``make_release(l.req_id, reason, at, l.granted_at, l.deadline, l.last_renewal)``
    for each of ``leases``."""
    if not leases:
        return []
    rids, granted, deadlines, renewals = zip(*map(_fields, leases), strict=True)
    out = map(_Building, rids, repeat(reason), repeat(at), granted, deadlines, renewals)
    return cast(list[Release], list(out))


@dataclass(frozen=True, slots=True)
class TransferCounted:
    """A transfer-done counted against a live lease that still waits for more
    readers: the blocks stay held, and this reader's read was good (I13: it is
    answered OK).

    Attributes:
        req_id: P's request id.
        at: the ``now`` of the call that counted it.
        done: transfer-dones counted so far, this one included.
        readers: how many complete the lease (the notification's ``n``, or
            the granted ``consumers`` when it carried none).
    """

    req_id: str
    at: float
    done: int = field(kw_only=True)
    readers: int = field(kw_only=True)


@dataclass(frozen=True, slots=True)
class LateTransfer:
    """A transfer-done arrived for a lease that had already ended -- expired,
    aborted, or completed by earlier transfer-dones: the reader may have read
    blocks that were freed and reused. The caller must act on it (answer the
    reader NK so it discards the read and recomputes, I13).

    Attributes:
        req_id: P's request id.
        ended: how the lease had ended (``EXPIRED``, ``ABORTED`` or ``TRANSFERRED``).
        at: the ``now`` of the call that saw the notification.
        ended_at: when the lease ended.
    """

    req_id: str
    ended: ReleaseReason
    at: float
    ended_at: float = field(default=0.0, kw_only=True)
