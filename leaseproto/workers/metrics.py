"""Prometheus metrics of the workers (``prometheus_client``).

Each worker owns a :class:`~prometheus_client.CollectorRegistry` and serves it
on its own HTTP port (``/metrics``). Lease counters are not counted twice:
they are mirrored from the core's own counters (:attr:`LeaseTable.stats`,
:attr:`HeartbeatTracker.stats`) by :meth:`PrefillMetrics.sync` /
:meth:`DecodeMetrics.sync`, which add the difference since the last call.

Every name starts with ``leaseproto_``; counters end in ``_total`` when
exposed.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..core.events import Release, ReleaseReason
from ..core.table import TableStats
from ..core.tracker import TrackerStats

__all__ = ["DecodeMetrics", "PrefillMetrics", "RouterMetrics", "WorkerMetrics"]

#: Buckets (seconds) for reclaim delays on a compressed or real timescale.
_DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    """A registry plus the HTTP endpoint that serves it."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        self.port: int | None = None
        self.malformed = self._counter(
            "malformed_messages", "Notifications or request-plane messages dropped as malformed"
        )

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter("leaseproto_" + name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge("leaseproto_" + name, doc, registry=self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: any free port); returns the port."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                "(--metrics-port 0 picks a free port, -1 disables metrics)"
            ) from exc
        self.port = int(server.server_port)
        logging.getLogger(f"leaseproto.{self.role}").info(
            "metrics on http://%s:%d/metrics", host, self.port
        )
        return self.port


def _delta(counter: Counter, new: int, old: int) -> None:
    if new > old:
        counter.inc(new - old)


class PrefillMetrics(WorkerMetrics):
    """Lease metrics of one prefill rank."""

    def __init__(self) -> None:
        super().__init__("prefill")
        c = self._counter
        self.granted = c("leases_granted", "Leases granted when prefill ended")
        self.renewed = c("leases_renewed", "Lease renewals applied by heartbeats")
        self.released = c("leases_released", "Leases released, by reason", ("reason",))
        for reason in ReleaseReason:
            self.released.labels(reason=reason.value)
        self.late_transfers = c(
            "late_transfer_notifications",
            "Transfer-done notifications for a lease already ended by expiry or abort",
        )
        self.early_transfers = c(
            "early_transfer_notifications",
            "Transfer-done or abort notifications that arrived before the grant (staged)",
        )
        self.heartbeats = c("heartbeats_received", "Heartbeat notifications received")
        self.heartbeat_ids = c("heartbeat_ids_received", "Request ids named by heartbeats")
        self.heartbeats_ignored = c(
            "heartbeat_ids_ignored", "Heartbeat ids naming no live lease (unknown, late, lapsed)"
        )
        self.nacks = c("nacks_sent", "NACKs sent to a reader after a late transfer-done")
        self.prefills = c("prefills", "Prompts prefilled")
        self.blocks_held = self._gauge("blocks_held", "KV blocks held under a live lease")
        self.leases_live = self._gauge("leases_live", "Live leases")
        self.blocks_free = self._gauge("blocks_free", "Free KV blocks in the pool")
        self.reclaim = Histogram(
            "leaseproto_reclaim_after_expiry_seconds",
            "Delay from an expired lease's deadline to the release of its blocks",
            buckets=_DELAY_BUCKETS,
            registry=self.registry,
        )
        self._last = TableStats()

    def sync(self, stats: TableStats) -> None:
        """Add the core's counter increments since the last call."""
        old = self._last
        _delta(self.granted, stats.granted, old.granted)
        _delta(self.renewed, stats.renewed, old.renewed)
        for reason in ReleaseReason:
            key = "released_" + reason.value
            _delta(
                self.released.labels(reason=reason.value), getattr(stats, key), getattr(old, key)
            )
        _delta(self.late_transfers, stats.late_transfers, old.late_transfers)
        _delta(self.early_transfers, stats.early_staged, old.early_staged)
        ignored = stats.renew_unknown + stats.renew_late + stats.renew_lapsed
        _delta(
            self.heartbeats_ignored, ignored, old.renew_unknown + old.renew_late + old.renew_lapsed
        )
        self.leases_live.set(stats.live)
        self._last = stats

    def observe_release(self, release: Release) -> None:
        if release.reason is ReleaseReason.EXPIRED:
            self.reclaim.observe(max(0.0, release.at - release.deadline))


class DecodeMetrics(WorkerMetrics):
    """Heartbeat and scheduling metrics of a decode engine."""

    def __init__(self) -> None:
        super().__init__("decode")
        c = self._counter
        self.heartbeats = c(
            "heartbeats_sent", "Heartbeat notifications sent (one per P rank and message)"
        )
        self.heartbeat_ids = c("heartbeat_ids_sent", "Request ids named by sent heartbeats")
        self.deferred = c(
            "heartbeats_deferred",
            "Due heartbeats held back while the engine's handshake was pending",
        )
        self.send_failures = c(
            "notification_send_failures", "Notifications that could not be sent (peer lost)"
        )
        self.engines_dropped = c("engines_dropped", "P engines dropped after a transport failure")
        self.failovers = c(
            "requests_failed_over", "Requests whose remote KV was lost, by action", ("action",)
        )
        for action in ("recompute", "error"):
            self.failovers.labels(action=action)
        self.nacks = c("nacks_received", "NACKs received: what was read must be discarded")
        self.transfers = c("kv_transfers", "KV reads completed, by outcome", ("outcome",))
        for outcome in ("done", "failed"):
            self.transfers.labels(outcome=outcome)
        self.completed = c("requests_completed", "Requests decoded to the end")
        self.tracked = self._gauge("requests_tracked", "Requests whose P lease D keeps alive")
        self.waiting = self._gauge("requests_waiting", "Requests in the waiting queue")
        self.running = self._gauge("requests_running", "Requests in the running set")
        self._last = TrackerStats()

    def sync(self, stats: TrackerStats) -> None:
        old = self._last
        _delta(self.deferred, stats.deferred, old.deferred)
        self.tracked.set(stats.live)
        self._last = stats


class RouterMetrics(WorkerMetrics):
    """Request counts of the router."""

    def __init__(self) -> None:
        super().__init__("router")
        self.requests = self._counter(
            "router_requests", "Requests finished, by outcome", ("outcome",)
        )
        for outcome in ("ok", "error"):
            self.requests.labels(outcome=outcome)
        self.latency = Histogram(
            "leaseproto_router_request_seconds",
            "Time from a client's request to its answer",
            buckets=_DELAY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = self._gauge("router_requests_in_flight", "Requests being served")


def stats_dict(stats: TableStats | TrackerStats) -> dict[str, Any]:
    """The core's counters as a plain dict (for the ``stats`` request-plane op)."""
    return asdict(stats)
