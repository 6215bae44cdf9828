"""What a worker does with notifications before the protocol sees them: a
size cap, a sender check, and a bounded, rate-limited log of what it drops.

A notification is untrusted input from the network. :class:`NotificationGate`
lets through only what is small enough (``max_bytes``; larger ones are dropped
and counted as ``oversized`` without being parsed) and, where the worker asks
for it, what comes from an agent that exchanged NIXL metadata with this one
(anyone who can reach the port can send a notification, but only a peer that
pushed its metadata, as our decode workers and vLLM do, is a peer; the rest
are counted as ``unknown_sender``). A notification from a sender whose
metadata has not arrived yet is held for ``hold_s`` (the metadata push and the
first notification travel on different channels) and let through once it has.

:class:`Inbox` is P's queue of admitted notifications: one FIFO per sender,
served round-robin within a time budget per loop turn, each handled at the
instant it was polled. A burst from one sender therefore delays another
sender's heartbeat by at most one message per round, and nothing expires
until every notification polled before the expiry instant has been handled.

:class:`~leaseproto.adapters.droplog.DropLog` (re-exported here) writes the
bounded, rate-limited log of what is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from ..adapters.droplog import DropLog

__all__ = ["MAX_INCOMING_BYTES", "DropLog", "Inbox", "NotificationGate"]

#: Default cap on one incoming notification, bytes (our own heartbeats are
#: split at ``max_notification_bytes``, 4 KiB by default; an unsplit vLLM
#: heartbeat of about 1,200 waiting requests fits).
MAX_INCOMING_BYTES = 64 * 1024


class NotificationGate:
    """Size cap and sender check for one worker's incoming notifications."""

    def __init__(
        self,
        drops: DropLog,
        *,
        max_bytes: int = MAX_INCOMING_BYTES,
        known: Callable[[str], bool] | None = None,
        hold_s: float = 1.0,
        max_held: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``known(sender)``: whether the sender exchanged metadata with us;
        ``None`` accepts every sender."""
        self.drops = drops
        self.max_bytes = max_bytes
        self.known = known
        self.hold_s = hold_s
        self.max_held = max_held
        self.clock = clock
        self._held: deque[tuple[float, str, bytes]] = deque()
        #: notifications dropped because they were larger than ``max_bytes``
        self.oversized = 0
        #: notifications dropped because their sender never became a peer
        self.unknown_sender = 0

    def admit(self, notifications: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """What of ``notifications`` (and of those held earlier) may be handled
        now, in arrival order per sender."""
        now = self.clock()
        out: list[tuple[str, bytes]] = []
        if self._held:
            # One look per sender: ``known`` is NIXL's view, which another
            # thread updates, and a sender whose metadata landed between two
            # of its held notifications must not have the later one handled
            # first (P would expire past the earlier one, A1).
            looked: dict[str, bool] = {}
            still: deque[tuple[float, str, bytes]] = deque()
            for arrived, sender, payload in self._held:
                ok = looked.get(sender)
                if ok is None:
                    ok = looked[sender] = self.known is not None and self.known(sender)
                if ok:
                    out.append((sender, payload))
                elif now - arrived >= self.hold_s:
                    self._unknown(sender, len(payload))
                else:
                    still.append((arrived, sender, payload))
            self._held = still
        waiting = {s for _, s, _ in self._held}
        for sender, payload in notifications:
            if len(payload) > self.max_bytes:
                self.oversized += 1
                self.drops.drop(
                    "oversized notification",
                    f"{len(payload)} bytes from {sender} (cap {self.max_bytes})",
                )
            elif self.known is None or (sender not in waiting and self.known(sender)):
                out.append((sender, payload))
            elif len(self._held) >= self.max_held:
                self._unknown(sender, len(payload))
            else:
                self._held.append((now, sender, payload))
                waiting.add(sender)
        return out

    def _unknown(self, sender: str, size: int) -> None:
        self.unknown_sender += 1
        self.drops.drop(
            "notification from an unknown agent",
            f"{size} bytes from {sender}, which never exchanged NIXL metadata with us",
        )


class Inbox:
    """Admitted notifications waiting to be handled, per sender, in order."""

    def __init__(self, *, max_pending: int = 100_000) -> None:
        self._queues: dict[str, deque[tuple[float, bytes]]] = {}
        self.max_pending = max_pending
        self.pending = 0
        #: notifications dropped because too many were pending
        self.overflow = 0

    def add(self, notifications: list[tuple[str, bytes]], *, polled: float) -> None:
        """Queue what one poll at ``polled`` returned."""
        for sender, payload in notifications:
            if self.pending >= self.max_pending:
                self.overflow += 1
                continue
            self._queues.setdefault(sender, deque()).append((polled, payload))
            self.pending += 1

    def __bool__(self) -> bool:
        return self.pending > 0

    def take(
        self, *, budget_s: float, clock: Callable[[], float] = time.monotonic
    ) -> Iterator[tuple[float, str, bytes]]:
        """``(polled_at, sender, payload)``, one per sender per round, until
        the queues are empty or ``budget_s`` has passed (at least one)."""
        end = clock() + budget_s
        while self._queues:
            for sender in list(self._queues):
                q = self._queues[sender]
                polled, payload = q.popleft()
                self.pending -= 1
                if not q:
                    del self._queues[sender]
                yield polled, sender, payload
            if clock() >= end:
                return
