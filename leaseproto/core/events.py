"""What the core hands back to its caller: small frozen value objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["LateTransfer", "Release", "ReleaseReason", "TransferCounted", "make_release"]


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


_new = object.__new__
_RELEASE_FIELDS = ("req_id", "reason", "at", "granted_at", "deadline", "last_renewal")
(_set_id, _set_reason, _set_at, _set_granted, _set_deadline, _set_renewal) = (
    getattr(Release, name).__set__ for name in _RELEASE_FIELDS
)


def make_release(  # noqa: PLR0917 - the fields, in order
    req_id: str,
    reason: ReleaseReason,
    at: float,
    granted_at: float,
    deadline: float,
    last_renewal: float | None,
) -> Release:
    """``Release(req_id, reason, at, granted_at=..., deadline=..., last_renewal=...)``
    built through its slots (a third of the frozen ``__init__``'s cost, for
    ``expire`` releasing thousands at once); ``tests/test_table.py`` checks it
    equals the constructor's."""
    r: Release = _new(Release)
    _set_id(r, req_id)
    _set_reason(r, reason)
    _set_at(r, at)
    _set_granted(r, granted_at)
    _set_deadline(r, deadline)
    _set_renewal(r, last_renewal)
    return r


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
