"""``LeaseprotoConnector``: vLLM's pull-mode NIXL connector on the lease core.

Load it with ``--kv-transfer-config '{"kv_connector": "LeaseprotoConnector",
"kv_connector_module_path": "leaseproto.integrations.vllm", ...}'``.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector

from .scheduler import LeaseprotoConnectorScheduler
from .stats import LeaseprotoKVConnectorStats, LeaseprotoPromMetrics
from .worker import LeaseprotoConnectorWorker

__all__ = ["LeaseprotoConnector"]


class LeaseprotoConnector(NixlPullConnector):  # type: ignore[misc]
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
