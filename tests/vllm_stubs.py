"""Schedulers and workers built the way vLLM's own tests build them (``object.__new__``
plus the fields the lease code touches), for stock vLLM and for LeaseprotoConnector,
so a test can drive both through the same calls. Needs vLLM."""

from __future__ import annotations

import queue
from collections import defaultdict
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

from leaseproto.integrations.vllm.scheduler import LeaseprotoConnectorScheduler
from leaseproto.integrations.vllm.stats import LeaseprotoKVConnectorStats
from leaseproto.integrations.vllm.worker import LeaseprotoConnectorWorker


class RecordingNixl:
    """A NIXL wrapper that records every notification sent and delivers queued ones."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.inbox: dict[str, list[bytes]] = {}

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        self.sent.append((agent_name, bytes(notif_msg)))

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        out, self.inbox = self.inbox, {}
        return out

    def get_agent_metadata(self) -> bytes:
        return b"\x00agent-metadata\xff"

    def add_remote_agent(self, metadata: bytes) -> str:
        self.added = [*getattr(self, "added", []), bytes(metadata)]
        return "d-agent"

    def check_xfer_state(self, handle: int) -> str:
        return "DONE"

    def get_xfer_telemetry(self, handle: int) -> None:
        return None

    def release_xfer_handle(self, handle: int) -> None:
        pass

    def deliver(self, agent: str, *msgs: bytes) -> None:
        self.inbox.setdefault(agent, []).extend(msgs)


def make_worker(
    ours: bool,
    *,
    kv_lease_duration: int = 30,
    extra: dict[str, Any] | None = None,
    agents: dict[str, dict[tuple[int, int], str]] | None = None,
) -> Any:
    cls = LeaseprotoConnectorWorker if ours else NixlPullConnectorWorker
    w = object.__new__(cls)
    w.vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config={"kv_lease_duration": kv_lease_duration, **(extra or {})}
        )
    )
    w._reqs_to_send = {}
    w._lease_extension = kv_lease_duration * 2 // 3
    w._reqs_to_process = set()
    w.consumer_notification_counts_by_req = defaultdict(int)
    w.expected_consumer_notifications_by_req = {}
    w.xfer_stats = LeaseprotoKVConnectorStats() if ours else NixlKVConnectorStats()
    w.nixl_wrapper = RecordingNixl()
    w.transfer_topo = MagicMock()
    w._remote_agents = dict(agents or {})
    w._engine_last_active = {}
    w._hb_handshake_notif_only = False
    # what vLLM's start_load_kv touches when it has nothing to read
    w._ready_requests = queue.Queue()
    w.pcp_rank = 0
    w.pcp_dcp_sharded = False
    w._recving_metadata = {}
    w._pending = set()  # engines whose handshake is still pending

    def ensure(engine_id: str, *args: Any) -> Future[Any] | None:
        if engine_id in w._pending:
            return Future()
        return None

    w._ensure_handshake = ensure
    return w


def make_scheduler(ours: bool, *, kv_lease_duration: int = 30) -> Any:
    cls = LeaseprotoConnectorScheduler if ours else NixlPullConnectorScheduler
    s = object.__new__(cls)
    s._has_mamba = False
    s._bounded_replay = False
    s._is_hma_required = False
    s.use_host_buffer = False
    s.vllm_config = SimpleNamespace(num_prefill_lookahead_tokens=0)
    s._kv_lease_duration = kv_lease_duration
    s._heartbeat_interval = kv_lease_duration // 6
    s._heartbeat_by_engine = {}
    s._heartbeat_req_engine = {}
    s._last_heartbeat_time = 0.0
    s._reqs_need_recv = {}
    s._hisparse_host_blocks_to_recv = {}
    s._reqs_need_send = {}
    s._reqs_in_batch = set()
    s._reqs_not_processed = set()
    s._reqs_need_save = {}
    return s


def d_request(local_id: str, remote_id: str, engine: str = "P0") -> Any:
    """A request entering D's waiting queue, P's transfer parameters attached."""
    return SimpleNamespace(
        request_id=local_id,
        kv_transfer_params={
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": engine,
            "remote_request_id": remote_id,
            "remote_host": "p-host",
            "remote_port": 5600,
            "tp_size": 1,
            "remote_block_ids": ([1, 2],),
        },
    )


def worker_stat(w: Any, key: str) -> int:
    return int(sum(w.xfer_stats.data.get(key, [])))
