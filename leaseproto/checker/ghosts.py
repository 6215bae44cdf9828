"""The checker's small value types: actions, messages in flight, ghost lease
instances, and the violation an invariant raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Action", "Instance", "Msg", "Violation"]

#: An action: its name and arguments, e.g. ``("grant", "P0", "r1")``.
Action = tuple[Any, ...]


class Violation(Exception):
    """An invariant failed: ``inv`` is its spec id."""

    def __init__(self, inv: str, text: str) -> None:
        super().__init__(f"{inv}: {text}")
        self.inv = inv
        self.text = text


@dataclass(frozen=True, slots=True)
class Msg:
    src: str
    dst: str
    data: bytes
    sent: int


@dataclass(slots=True)
class Instance:
    """Ghost: one grant of request ``r`` on one P rank."""

    live: bool = True
    reason: str | None = None
    ended_at: int | None = None
    #: transfer-dones P handled for this instance (staged ones included)
    tds: int = 0
    #: when P granted it, and when P last applied a heartbeat naming it (I5-I7)
    granted_at: int = 0
    renewed_at: int | None = None
