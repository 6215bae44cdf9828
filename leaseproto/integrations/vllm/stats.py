"""Our counters beside vLLM's NIXL stats and Prometheus metrics.

The worker records into :class:`LeaseprotoKVConnectorStats` (vLLM's stats plus
our keys); the engine's Prometheus output then has ``vllm:leaseproto_*``
counters next to ``vllm:nixl_*`` (:class:`LeaseprotoPromMetrics`).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
    NixlPromMetrics,
)
from vllm.v1.metrics.utils import create_metric_per_engine

__all__ = ["COUNTERS", "LeaseprotoKVConnectorStats", "LeaseprotoPromMetrics"]

#: stats key -> (Prometheus name, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "lp_leases_granted": ("vllm:leaseproto_leases_granted", "KV leases granted on P (leaseproto)."),
    "lp_leases_renewed": (
        "vllm:leaseproto_leases_renewed",
        "Lease renewals from D's heartbeats on P.",
    ),
    "lp_heartbeat_ids_unknown": (
        "vllm:leaseproto_heartbeat_ids_unknown",
        "Heartbeat ids naming no lease P holds.",
    ),
    "lp_heartbeat_ids_late": (
        "vllm:leaseproto_heartbeat_ids_late",
        "Heartbeat ids naming a lease that had ended or lapsed.",
    ),
    "lp_late_reads": (
        "vllm:leaseproto_late_reads",
        "Transfer-dones after the lease had ended (expired or aborted).",
    ),
    "lp_aborted": ("vllm:leaseproto_leases_aborted", "Leases released by D's abort."),
    "lp_malformed": (
        "vllm:leaseproto_malformed_notifications",
        "Notifications that were not valid messages (counted and dropped).",
    ),
    "lp_heartbeats_sent": (
        "vllm:leaseproto_heartbeats_sent",
        "Heartbeat notifications sent by D (after splitting).",
    ),
    "lp_heartbeats_deferred": (
        "vllm:leaseproto_heartbeats_deferred",
        "Heartbeats held for a pending handshake, sent once it is done.",
    ),
    "lp_heartbeat_send_failures": (
        "vllm:leaseproto_heartbeat_send_failures",
        "Heartbeat notifications NIXL failed to send.",
    ),
    "lp_verdicts_sent": (
        "vllm:leaseproto_verdicts_sent",
        "OK/NK verdicts P sent to decode agents that understand them.",
    ),
    "lp_ll_sent": (
        "vllm:leaseproto_lease_lost_sent",
        "Advisory lease-lost answers P sent to heartbeats naming lost leases.",
    ),
    "lp_verdict_send_failures": (
        "vllm:leaseproto_verdict_send_failures",
        "Verdicts NIXL failed to send.",
    ),
    "lp_reads_verified": ("vllm:leaseproto_reads_verified", "READs D reported after P's OK."),
    "lp_reads_refused": (
        "vllm:leaseproto_reads_refused",
        "READs D failed on P's NK (recomputed by kv_load_failure_policy).",
    ),
    "lp_verdict_waits": (
        "vllm:leaseproto_verdict_waits",
        "D engine steps that waited (up to verdict_wait) for the verdicts of READs they saw "
        "complete.",
    ),
    "lp_verdict_waits_missed": (
        "vllm:leaseproto_verdict_waits_missed",
        "Verdict waits that ended with a verdict still missing (the READ is reported later).",
    ),
    "lp_idle_waits": (
        "vllm:leaseproto_idle_waits",
        "Engine steps with nothing to compute that polled notifications (up to idle_wait) "
        "while holding leases, instead of returning at once.",
    ),
    "lp_reads_verdict_timeout": (
        "vllm:leaseproto_reads_verdict_timeout",
        "READs D failed for want of a verdict within the bound.",
    ),
    "lp_foreign_acts": (
        "vllm:leaseproto_foreign_acts",
        "Heartbeat ids, transfer-dones and aborts from a D agent the lease is not bound to "
        "(ignored, P).",
    ),
    "lp_foreign_verdicts": (
        "vllm:leaseproto_foreign_verdicts",
        "OK, NK and LL from a P agent the read did not go to (ignored, D).",
    ),
    "lp_unmatched_verdicts": (
        "vllm:leaseproto_unmatched_verdicts",
        "OK, NK and LL naming no read in progress: late, duplicate or forged (ignored, D).",
    ),
    "lp_auth_dropped": (
        "vllm:leaseproto_auth_dropped",
        "Notifications a keyed engine dropped: not sealed with the cluster key for it, or "
        "replayed.",
    ),
    "lp_key_mismatch": (
        "vllm:leaseproto_key_mismatch",
        "READs D refused because P advertised no cluster key or another one (recomputed).",
    ),
    "lp_auth_held_dropped": (
        "vllm:leaseproto_auth_held_dropped",
        "Sealed notifications dropped while a P had not answered D's hello (oldest first).",
    ),
    "lp_decoders_forgotten": (
        "vllm:leaseproto_decoders_forgotten",
        "Silent decode agents whose NIXL metadata P removed.",
    ),
    # push mode (LeaseprotoPushConnector)
    "lp_push_writes_verified": (
        "vllm:leaseproto_push_writes_verified",
        "Pushed KV D used: the WRITE completed while its registration was live (D).",
    ),
    "lp_push_recv_failed": (
        "vllm:leaseproto_push_recv_failed",
        "Push receives D failed (recomputed): registration expired, aborted or its WRITE late (D).",
    ),
    "lp_push_quarantined": (
        "vllm:leaseproto_push_quarantined",
        "Registrations that ended without their WRITE while a leaseproto P might still write: "
        "blocks held until each writer completes, aborts or is forgotten (D).",
    ),
    "lp_push_writers_forgotten": (
        "vllm:leaseproto_push_writers_forgotten",
        "P agents D forgot while a registration waited for them: gone from its connections, "
        "a send failed, or silent past the bound (D).",
    ),
    "lp_push_writes_refused": (
        "vllm:leaseproto_push_writes_refused",
        "WRITE completions after the registration ended: not used (D), or NK from D (P).",
    ),
    "lp_push_writes_done": (
        "vllm:leaseproto_push_writes_done",
        "Leases P ended because its WRITE into D completed (P).",
    ),
    "lp_push_writes_confirmed": (
        "vllm:leaseproto_push_writes_confirmed",
        "OK verdicts from D for P's WRITEs (P).",
    ),
    "lp_push_aborts_sent": (
        "vllm:leaseproto_push_aborts_sent",
        "AB: sent to D for registrations P will not write (P).",
    ),
    "lp_push_lease_lost": (
        "vllm:leaseproto_push_lease_lost",
        "LL: from D for a registration P renewed (P).",
    ),
}


class LeaseprotoKVConnectorStats(NixlKVConnectorStats):  # type: ignore[misc]
    """vLLM's NIXL stats plus ours (each a list of increments, as vLLM's are)."""

    def reset(self) -> None:
        super().reset()
        for key in COUNTERS:
            self.data[key] = []

    def add(self, key: str, n: int = 1) -> None:
        if n:
            self.data.setdefault(key, []).append(n)

    def is_empty(self) -> bool:
        return bool(super().is_empty()) and not any(self.data.get(k) for k in COUNTERS)

    def aggregate(self, other: Any) -> Any:
        for key in COUNTERS:
            self.data.setdefault(key, [])
            if isinstance(other, NixlKVConnectorStats):
                other.data.setdefault(key, [])
        return super().aggregate(other)

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(super().reduce())
        for key in ("lp_late_reads", "lp_malformed"):
            out[COUNTERS[key][0].split(":", 1)[1]] = sum(self.data.get(key, []))
        return out


class LeaseprotoPromMetrics(NixlPromMetrics):  # type: ignore[misc]
    """vLLM's NIXL Prometheus metrics plus one counter per :data:`COUNTERS` key."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.lp_counters = {
            key: create_metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames),
                self.per_engine_labelvalues,
            )
            for key, (name, doc) in COUNTERS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key in COUNTERS:
            transfer_stats_data.setdefault(key, [])
        super().observe(transfer_stats_data, engine_idx)
        for key, counter in self.lp_counters.items():
            for n in transfer_stats_data[key]:
                counter[engine_idx].inc(n)
