"""Prometheus metrics of the workers (``prometheus_client``).

Each worker owns a :class:`~prometheus_client.CollectorRegistry` and serves it
on its own HTTP port (``/metrics``). Every series carries ``engine_id`` and
``rank`` labels (the router's: ``engine_id="router"``), and
``leaseproto_build_info`` says which version and role is serving.

The core's own counters (:attr:`LeaseTable.stats`, :attr:`HeartbeatTracker.stats`)
are not mirrored into ``prometheus_client`` counters: :class:`CoreCollector`
reads them when Prometheus scrapes, so an exported value is the core's value,
never a copy one step behind. What only a worker sees (messages it sent, blocks
in its pool, how long a lease was held or a transfer took) is counted here.

Every name starts with ``leaseproto_``; counters end in ``_total`` when
exposed. ``docs/metrics.md`` lists them beside vLLM's ``vllm:nixl_*``.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..core.events import Release, ReleaseReason
from ..core.lease import TableStats
from ..core.tracker import TrackerStats

__all__ = [
    "CoreCollector",
    "DecodeMetrics",
    "PrefillMetrics",
    "RouterMetrics",
    "WorkerMetrics",
    "stats_dict",
]

#: The labels every series carries.
BASE_LABELS = ("engine_id", "rank")
#: Buckets (seconds) for delays on a compressed or real timescale.
_DELAY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Buckets (seconds) for how long a lease is held: up to a long queue wait.
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


@dataclass(frozen=True)
class CoreSeries:
    """One series read from a core stats object at scrape time."""

    name: str  # without ``leaseproto_`` and ``_total``
    doc: str
    kind: str  # "counter" or "gauge"
    value: Callable[[Any], float]
    #: (label, value) of this series in its family, if the family has a label
    label: tuple[str, str] | None = None


class CoreCollector(Collector):
    """A ``prometheus_client`` collector over ``read()`` (a core stats snapshot),
    called on each scrape from the HTTP server's thread. The core's counters are
    plain integers in a dict of fixed keys, so reading them while the engine loop
    runs sees a value at most one increment old and never a torn one."""

    def __init__(
        self, read: Callable[[], Any], series: Sequence[CoreSeries], base: dict[str, str]
    ) -> None:
        self.read = read
        self.series = tuple(series)
        self.base = base

    def collect(self) -> Iterator[Metric]:
        stats = self.read()
        families: dict[str, Any] = {}
        for s in self.series:
            fam = families.get(s.name)
            if fam is None:
                labels = [*self.base, *([s.label[0]] if s.label else [])]
                kind = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                fam = families[s.name] = kind("leaseproto_" + s.name, s.doc, labels=labels)
            values = [*self.base.values(), *([s.label[1]] if s.label else [])]
            fam.add_metric(values, float(s.value(stats)))
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return self.collect()


class _Family:
    """A labelled metric whose ``engine_id`` and ``rank`` are bound:
    ``.labels(reason=...)`` gives the child."""

    def __init__(self, metric: Any, base: dict[str, str]) -> None:
        self.metric = metric
        self.base = base

    def labels(self, **labels: str) -> Any:
        return self.metric.labels(**self.base, **labels)


class WorkerMetrics:
    """A registry plus the HTTP endpoint that serves it."""

    def __init__(self, role: str, engine_id: str, rank: int) -> None:
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        self.base = {"engine_id": engine_id, "rank": str(rank)}
        self.port: int | None = None
        build = Info(
            "leaseproto_build",
            "The leaseproto version and role serving these metrics",
            BASE_LABELS,
            registry=self.registry,
        )
        build.labels(**self.base).info(
            {"version": __version__, "role": role, "python": platform.python_version()}
        )
        self.malformed = self._counter(
            "malformed_messages", "Notifications or request-plane messages dropped as malformed"
        )

    def _counter(self, name: str, doc: str) -> Any:
        return Counter("leaseproto_" + name, doc, BASE_LABELS, registry=self.registry).labels(
            **self.base
        )

    def _counters(self, name: str, doc: str, label: str, values: Sequence[str]) -> _Family:
        metric = Counter("leaseproto_" + name, doc, (*BASE_LABELS, label), registry=self.registry)
        for v in values:  # every series exists from the start, at 0
            metric.labels(**self.base, **{label: v})
        return _Family(metric, self.base)

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge("leaseproto_" + name, doc, BASE_LABELS, registry=self.registry).labels(
            **self.base
        )

    def _histogram(
        self,
        name: str,
        doc: str,
        buckets: Sequence[float],
        label: str | None = None,
        values: Sequence[str] = (),
    ) -> Any:
        labels = (*BASE_LABELS, label) if label else BASE_LABELS
        metric = Histogram(
            "leaseproto_" + name, doc, labels, buckets=tuple(buckets), registry=self.registry
        )
        if label is None:
            return metric.labels(**self.base)
        for v in values:
            metric.labels(**self.base, **{label: v})
        return _Family(metric, self.base)

    def collect_core(self, read: Callable[[], Any], series: Sequence[CoreSeries]) -> None:
        """Export ``series`` of the core stats ``read()`` returns, read at scrape time."""
        self.registry.register(CoreCollector(read, series, self.base))

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


def _released(reason: ReleaseReason) -> Callable[[Any], float]:
    key = "released_" + reason.value
    return lambda stats: float(getattr(stats, key))


#: The lease table's counters, as P exports them.
TABLE_SERIES: tuple[CoreSeries, ...] = (
    CoreSeries(
        "leases_granted", "Leases granted when prefill ended", "counter", lambda s: s.granted
    ),
    CoreSeries(
        "leases_renewed", "Lease renewals applied by heartbeats", "counter", lambda s: s.renewed
    ),
    *(
        CoreSeries(
            "leases_released",
            "Leases released, by reason",
            "counter",
            _released(r),
            ("reason", r.value),
        )
        for r in ReleaseReason
    ),
    CoreSeries(
        "late_transfer_notifications",
        "Transfer-done notifications for a lease already ended by expiry or abort",
        "counter",
        lambda s: s.late_transfers,
    ),
    CoreSeries(
        "excess_transfer_notifications",
        "Transfer-done notifications for a lease its readers had already completed",
        "counter",
        lambda s: s.excess_transfers,
    ),
    CoreSeries(
        "early_transfer_notifications",
        "Transfer-done or abort notifications that arrived before the grant (staged)",
        "counter",
        lambda s: s.early_staged,
    ),
    CoreSeries(
        "heartbeat_ids_ignored",
        "Heartbeat ids naming no live lease (unknown, late, lapsed)",
        "counter",
        lambda s: s.renew_unknown + s.renew_late + s.renew_lapsed,
    ),
    CoreSeries("leases_live", "Live leases", "gauge", lambda s: s.live),
)

#: The heartbeat tracker's counters, as D exports them.
TRACKER_SERIES: tuple[CoreSeries, ...] = (
    CoreSeries(
        "heartbeats_deferred",
        "Due heartbeats held back while the engine's handshake was pending",
        "counter",
        lambda s: s.deferred,
    ),
    CoreSeries(
        "requests_dropped_with_engine",
        "Tracked requests dropped with their P engine (peer lost)",
        "counter",
        lambda s: s.dropped,
    ),
    CoreSeries(
        "requests_tracked", "Requests whose P lease D keeps alive", "gauge", lambda s: s.live
    ),
)


class PrefillMetrics(WorkerMetrics):
    """Lease metrics of one prefill rank; ``table_stats`` reads its lease table."""

    def __init__(
        self,
        engine_id: str = "prefill-engine",
        rank: int = 0,
        *,
        table_stats: Callable[[], TableStats] = TableStats,
    ) -> None:
        super().__init__("prefill", engine_id, rank)
        self.collect_core(table_stats, TABLE_SERIES)
        c = self._counter
        self.heartbeats = c("heartbeats_received", "Heartbeat notifications received")
        self.heartbeat_ids = c("heartbeat_ids_received", "Request ids named by heartbeats")
        self.nacks = c("nacks_sent", "NACKs sent to a reader after a late transfer-done")
        self.prefills = c("prefills", "Prompts prefilled")
        self.acts_refused = self._counters(
            "acts_refused",
            "Heartbeat ids, transfer-dones and aborts from an agent the lease is not bound to",
            "kind",
            ("heartbeat", "transfer_done", "abort"),
        )
        self.agents_forgotten = c(
            "agents_forgotten", "Silent decoder agents whose NIXL metadata P removed"
        )
        self.blocks_held = self._gauge("blocks_held", "KV blocks held under a live lease")
        self.blocks_free = self._gauge("blocks_free", "Free KV blocks in the pool")
        self.prefix_reads = self._counters(
            "prefix_reads",
            "Turn-2 prefixes read from D's cached turn, by outcome: verified (D's OK from "
            "every rank read, I14), unverified (used as read: --turn-reads gate-only) or "
            "recomputed because of nack, timeout, lost or gate",
            "outcome",
            ("verified", "unverified", "nack", "timeout", "lost", "gate"),
        )
        self.prefix_heartbeats = c(
            "prefix_heartbeats_sent", "Heartbeats P sent D for turn-2 requests waiting (I16)"
        )
        self.reclaim = self._histogram(
            "reclaim_after_expiry_seconds",
            "Delay from an expired lease's deadline to the release of its blocks",
            _DELAY_BUCKETS,
        )
        self.hold = self._histogram(
            "lease_hold_seconds",
            "How long a lease held its blocks, from the grant to the release, by reason",
            _HOLD_BUCKETS,
            label="reason",
            values=[r.value for r in ReleaseReason],
        )

    def observe_release(self, release: Release) -> None:
        self.hold.labels(reason=release.reason.value).observe(
            max(0.0, release.at - release.granted_at)
        )
        if release.reason is ReleaseReason.EXPIRED:
            self.reclaim.observe(max(0.0, release.at - release.deadline))


class DecodeMetrics(WorkerMetrics):
    """Heartbeat and scheduling metrics of a decode rank; ``tracker_stats``
    reads its heartbeat tracker (rank 0; the other ranks track nothing)."""

    def __init__(
        self,
        engine_id: str = "decode-engine",
        rank: int = 0,
        *,
        tracker_stats: Callable[[], TrackerStats] = TrackerStats,
    ) -> None:
        super().__init__("decode", engine_id, rank)
        self.collect_core(tracker_stats, TRACKER_SERIES)
        c = self._counter
        self.heartbeats = c(
            "heartbeats_sent", "Heartbeat notifications sent (one per P rank and message)"
        )
        self.heartbeat_ids = c("heartbeat_ids_sent", "Request ids named by sent heartbeats")
        self.send_failures = c(
            "notification_send_failures", "Notifications that could not be sent (peer lost)"
        )
        self.engines_dropped = c("engines_dropped", "P engines dropped after a transport failure")
        self.failovers = self._counters(
            "requests_failed_over",
            "Requests whose remote KV was lost, by action",
            "action",
            ("recompute", "error"),
        )
        self.nacks = c("nacks_received", "NACKs received: what was read must be discarded")
        self.transfers = self._counters(
            "kv_transfers", "KV reads completed, by outcome", "outcome", ("done", "failed")
        )
        self.transfer_time = self._histogram(
            "kv_transfer_seconds",
            "Time from starting a request's KV reads to the last one done",
            _DELAY_BUCKETS,
        )
        self.completed = c("requests_completed", "Requests decoded to the end")
        self.verdicts = self._counters(
            "read_verdicts",
            "Reads of P's KV by what decided their use: ok (P's OK from every rank), nk "
            "(discarded), timeout (no verdict in time: discarded), unverified (P gives none)",
            "verdict",
            ("ok", "nk", "timeout", "unverified"),
        )
        self.verdict_wait = self._histogram(
            "verdict_wait_seconds",
            "Delay from a READ's completion to the last OK it waited for",
            _DELAY_BUCKETS,
        )
        self.turns_cached = c(
            "turns_cached", "Finished turns whose KV D keeps under a lease for the next turn"
        )
        self.turn_releases = self._counters(
            "turn_leases_released",
            "D's cached-turn leases released, by how they ended",
            "reason",
            [r.value for r in ReleaseReason],
        )
        self.turn_verdicts = self._counters(
            "turn_verdicts_sent",
            "Verdicts D sent P on its reads of cached turns",
            "verdict",
            ("ok", "nk", "ll", "hello"),
        )
        self.turn_blocks_held = self._gauge(
            "turn_blocks_held", "KV blocks D holds under cached-turn leases"
        )
        self.waiting = self._gauge("requests_waiting", "Requests in the waiting queue")
        self.running = self._gauge("requests_running", "Requests in the running set")


class RouterMetrics(WorkerMetrics):
    """Request counts of the router."""

    def __init__(self) -> None:
        super().__init__("router", "router", 0)
        self.requests = self._counters(
            "router_requests", "Requests finished, by outcome", "outcome", ("ok", "error")
        )
        self.latency = self._histogram(
            "router_request_seconds", "Time from a client's request to its answer", _DELAY_BUCKETS
        )
        self.in_flight = self._gauge("router_requests_in_flight", "Requests being served")
        self.prefixes = self._counters(
            "router_prefixes",
            "Conversation turns by what the router did with the last turn's cache on D: "
            "sent (to P, as the prefix), mismatch (the prompt does not extend it), expired",
            "outcome",
            ("sent", "mismatch", "expired"),
        )


def stats_dict(stats: TableStats | TrackerStats) -> dict[str, Any]:
    """The core's counters as a plain dict (for the ``stats`` request-plane op)."""
    return asdict(stats)
