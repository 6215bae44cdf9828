"""The connection half of :class:`~leaseproto.adapters.nixl.NixlEndpoint`:
fetching and pushing metadata, retries and timeouts, names bound to
addresses (a probe the loaded metadata must cover), pushing again after a
quiet spell, and marking peers lost. How NIXL behaves on this path is in
:mod:`leaseproto.adapters.nixl_runtime`; the endpoint's module notes say what
the endpoint promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .nixl_runtime import MAX_RETRY_DELAY, ConnState, EndpointStats, describe, is_disconnect
from .xfer import XferDescs

__all__ = ["EndpointPeers", "PeerRecord"]


@dataclass(slots=True)
class PeerRecord:
    """What the endpoint keeps of a peer it connected to."""

    host: str
    port: int
    state: ConnState
    started: float
    last_try: float
    delay: float
    reason: str = ""
    #: memory the peer said it serves: connected only once its metadata covers it
    probe: XferDescs | None = None
    #: when we last sent it a notification or started a READ (or pushed metadata)
    last_sent: float = 0.0


class EndpointPeers:
    """Peer records and connection progress; the endpoint supplies its agent
    and settings (declared below)."""

    _agent: Any
    _peers: dict[str, PeerRecord]
    _lost: list[tuple[str, str]]
    stats: EndpointStats
    connect_timeout: float
    connect_retry: float
    repush_idle: float | None

    def _peer_state(self, peer: str) -> ConnState | None:
        """State of a peer we connected to (a pending connect advanced first), or
        None for one that only connected to us."""
        rec = self._peers.get(peer)
        if rec is None:
            return None
        self._progress(peer, rec, time.monotonic())
        return rec.state

    def _fetch(self, peer: str, rec: PeerRecord) -> None:
        try:
            self._agent.fetch_remote_metadata(peer, rec.host, rec.port)
        except Exception as exc:
            self.stats.last_error = describe(exc)
        self._push_metadata(peer, rec)

    def _push_metadata(self, peer: str, rec: PeerRecord) -> None:
        try:
            self._agent.send_local_metadata(rec.host, rec.port)
        except Exception as exc:
            self.stats.last_error = f"pushing metadata to {peer}: {describe(exc)}"

    def _repush_if_idle(self, peer: str) -> None:
        """Push our metadata to a peer we connected to again when nothing went
        to it for ``repush_idle`` seconds (it may have forgotten us)."""
        rec = self._peers.get(peer)
        if rec is None or self.repush_idle is None or not rec.host:
            return
        now = time.monotonic()
        if now - rec.last_sent >= self.repush_idle:
            self.stats.repushes += 1
            self._push_metadata(peer, rec)
        rec.last_sent = now

    def _remove(self, peer: str) -> None:
        try:
            self._agent.remove_remote_agent(peer)
        except Exception as exc:
            self.stats.last_error = f"removing {peer}: {describe(exc)}"

    def _covers(self, peer: str, probe: XferDescs) -> bool:
        try:
            descs = self._agent.get_xfer_descs(list(probe.descs), probe.mem_type)
            return bool(self._agent.check_remote_metadata(peer, descs))
        except Exception as exc:
            self.stats.last_error = f"checking {peer}'s metadata: {describe(exc)}"
            return False

    def _progress(self, peer: str, rec: PeerRecord, now: float) -> None:
        if rec.state != "connecting":
            return
        loaded = self._agent.check_remote_metadata(peer)
        if loaded and (rec.probe is None or self._covers(peer, rec.probe)):
            rec.state = "connected"
        elif now - rec.started >= self.connect_timeout:
            self._mark_lost(
                peer,
                rec,
                "failed",
                f"connect timeout after {self.connect_timeout:g} s ({rec.host}:{rec.port})",
            )
        elif now - rec.last_try >= rec.delay:
            rec.last_try = now
            rec.delay = min(2.0 * rec.delay, MAX_RETRY_DELAY)
            self.stats.connect_retries += 1
            if loaded:  # not the memory the peer serves: another's, or stale
                self.stats.names_refetched += 1
                self._remove(peer)
            self._fetch(peer, rec)

    def _progress_all(self) -> None:
        now = time.monotonic()
        for peer, rec in self._peers.items():
            self._progress(peer, rec, now)

    def _failed(self, peer: str, exc: BaseException) -> None:
        self.stats.last_error = f"{peer}: {describe(exc)}"
        if is_disconnect(exc):
            rec = self._peers.get(peer)
            if rec is None:
                rec = PeerRecord(
                    host="",
                    port=0,
                    state="connected",
                    started=0.0,
                    last_try=0.0,
                    delay=self.connect_retry,
                )
                self._peers[peer] = rec
            if rec.state not in ("lost", "failed"):
                self._mark_lost(peer, rec, "lost", "disconnected")

    def _mark_lost(self, peer: str, rec: PeerRecord, state: ConnState, reason: str) -> None:
        rec.state = state
        rec.reason = reason
        self.stats.peers_lost += 1
        self._lost.append((peer, reason))

    def _refetch(self, peer: str) -> None:
        rec = self._peers.get(peer)
        if rec is None or not rec.host:
            return  # it connected to us: we do not know where it listens
        now = time.monotonic()
        if now - rec.last_try >= self.connect_retry:
            rec.last_try = now
            self.stats.connect_retries += 1
            self._fetch(peer, rec)
