"""What the core hands back to its caller: small frozen value objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["LateTransfer", "Release", "ReleaseReason"]


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
class LateTransfer:
    """A transfer-done arrived for a lease that had already ended by expiry or
    abort: the reader may have read blocks that were freed and reused. The
    caller must act on it (NACK the reader so it recomputes, or alert).

    Attributes:
        req_id: P's request id.
        ended: how the lease had ended (``EXPIRED`` or ``ABORTED``).
        at: the ``now`` of the call that saw the notification.
        ended_at: when the lease ended.
    """

    req_id: str
    ended: ReleaseReason
    at: float
    ended_at: float = field(default=0.0, kw_only=True)
