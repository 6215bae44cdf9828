"""What the core hands back to its caller: small frozen value objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["LateTransfer", "Release", "ReleaseReason", "TransferCounted"]


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
