"""The attributes decode rank 0 holds, declared once for the halves of its
worker (:mod:`.decode_leases`, :mod:`.decode_reads`), which the worker
(:mod:`.decode`) combines and fills in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..core.config import LeaseConfig
from ..core.tracker import HeartbeatTracker
from .decode_state import DecodeOptions, Engine, PAgent, Req
from .metrics import DecodeMetrics
from .notifications import DropLog

if TYPE_CHECKING:
    from .backend import KVBackend

__all__ = ["DecodeView"]


class DecodeView:
    """What decode rank 0 holds; :class:`~.decode.DecodeWorker` sets every
    attribute."""

    opts: DecodeOptions
    config: LeaseConfig
    tracker: HeartbeatTracker
    backend: KVBackend
    metrics: DecodeMetrics
    engines: dict[str, Engine]
    #: P agents whose reads D verifies, and engines it was told give verdicts:
    #: a request-plane message can add to them, never remove (spec §7.4)
    verdict_agents: dict[str, PAgent]
    verdict_engines: set[str]
    by_remote: dict[str, Req]
    waiting: Iterable[Req]
    running: dict[str, Req]
    counts: dict[str, int]
    drops: DropLog
    #: the other log lines a peer or client can trigger, rate-limited alike
    notes: DropLog

    def _clock(self) -> float:
        raise NotImplementedError

    def _malformed(self, why: str) -> None:
        raise NotImplementedError
