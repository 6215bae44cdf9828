"""A trace's events and the violations found in them (trace validation, §9.1).

An :class:`Event` is one line of a worker's trace
(:mod:`leaseproto.adapters.trace_writer`), a :class:`Violation` the first thing
about one that no legal transition explains. Beside them, what an event's fields
say: a logged release as the core's record, and which side of a process a
message belongs to (spec §2.8: what a reader sends, and the verdicts it
receives, never pass through the process's grant table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import wire
from ..core.events import Release, ReleaseReason

__all__ = ["Event", "Violation"]

#: D's hello in the vLLM connector (its agent metadata follows): D reads verdicts
HELLO = (wire.CAPABILITY + ",hello,").encode()
#: vLLM's push registration (a msgpack dict follows), D -> P
PUSH_REG = b"PUSH_REG:"


@dataclass(frozen=True)
class Event:
    """One line of a trace: where it is, and what it says."""

    path: str
    line: int
    obj: dict[str, Any]

    @property
    def ev(self) -> str:
        return str(self.obj.get("ev"))

    @property
    def t(self) -> float:
        """The worker's monotonic clock at the event (0 when unreadable)."""
        t = self.obj.get("t", 0.0)
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0

    def data(self) -> bytes:
        return str(self.obj.get("data", "")).encode("latin-1")


@dataclass(frozen=True)
class Violation:
    """The first thing about an event that no legal transition explains."""

    invariant: str
    event: Event
    message: str

    def __str__(self) -> str:
        return f"{self.event.path}:{self.event.line}: {self.invariant}: {self.message}"


def _release_of(obj: dict[str, Any]) -> Release:
    return Release(
        str(obj["req"]),
        ReleaseReason(obj["reason"]),
        float(obj["at"]),
        granted_at=float(obj["granted_at"]),
        deadline=float(obj["deadline"]),
        last_renewal=None if obj.get("last_renewal") is None else float(obj["last_renewal"]),
    )


def _reader_sends(data: bytes) -> bool:
    """What a reader sends (a hello, heartbeat, transfer-done or abort), or a push
    registration (vLLM's ``PUSH_REG:``, which announces D's grant): never an
    output of a grant table, so a process that also reads sends them (spec §2.8)."""
    if data.startswith(HELLO) or data.startswith(PUSH_REG):
        return True
    try:
        msg = wire.decode(data)
    except wire.MalformedMessage:
        return False
    return isinstance(msg, (wire.Heartbeat, wire.TransferDone, wire.Abort))


def _reader_side(data: bytes) -> bool:
    """A verdict or lease-lost: what a grantor sends, handled by the reader side of
    the process that received it, never by its grant table (spec §2.8)."""
    try:
        msg = wire.decode(data)
    except wire.MalformedMessage:
        return False
    return isinstance(msg, (wire.Ok, wire.Nack, wire.LeaseLost))
