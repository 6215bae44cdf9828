"""``LeaseprotoConnector`` and ``LeaseprotoPushConnector``: vLLM's pull-mode
and push-mode NIXL connectors on the lease core.

Load one with ``--kv-transfer-config '{"kv_connector": "LeaseprotoConnector",
"kv_connector_module_path": "leaseproto.integrations.vllm", ...}'`` (push mode:
``"LeaseprotoPushConnector"``, where vLLM takes ``"NixlPushConnector"``).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlPullConnector,
    NixlPushConnector,
)

from .push_scheduler import LeaseprotoPushConnectorScheduler
from .push_worker import LeaseprotoPushConnectorWorker
from .scheduler import LeaseprotoConnectorScheduler
from .stats import LeaseprotoKVConnectorStats, LeaseprotoPromMetrics
from .worker import LeaseprotoConnectorWorker

__all__ = ["LeaseprotoConnector", "LeaseprotoPushConnector"]


class _OurStats:
    """Our counters beside vLLM's NIXL stats and metrics (both connectors)."""

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> Any:
        return (
            LeaseprotoKVConnectorStats(data=data)
            if data is not None
            else LeaseprotoKVConnectorStats()
        )

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> Any:
        return LeaseprotoPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)


class LeaseprotoConnector(_OurStats, NixlPullConnector):  # type: ignore[misc]
    """NIXL pull connector whose leases are leaseproto's ``LeaseTable`` (P) and
    ``HeartbeatTracker`` (D)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        # NixlPullConnector's own __init__ would build vLLM's scheduler/worker first
        super(NixlPullConnector, self).__init__(vllm_config, role, kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = LeaseprotoConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = LeaseprotoConnectorWorker(
                vllm_config, self.engine_id, kv_cache_config
            )


class LeaseprotoPushConnector(_OurStats, NixlPushConnector):  # type: ignore[misc]
    """NIXL push connector: D's registrations are leases in D's table, renewed
    by P's heartbeats, and D uses a WRITE only if it completed while the
    registration was live (spec §2.8); P's leases as in pull mode."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        # NixlPushConnector's own __init__ would build vLLM's scheduler/worker first
        super(NixlPushConnector, self).__init__(vllm_config, role, kv_cache_config)
        if vllm_config.parallel_config.decode_context_parallel_size > 1:
            raise ValueError(
                "LeaseprotoPushConnector does not support decode_context_parallel_size > 1 "
                "(vLLM's push mode does not)"
            )
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = LeaseprotoPushConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = LeaseprotoPushConnectorWorker(
                vllm_config, self.engine_id, kv_cache_config
            )
        else:
            raise ValueError(f"Unsupported KVConnectorRole: {role}")
