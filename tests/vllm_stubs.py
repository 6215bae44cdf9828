"""Schedulers and workers built the way vLLM's own tests build them (``object.__new__``
plus the fields the lease code touches), for stock vLLM and for LeaseprotoConnector,
so a test can drive both through the same calls. Needs vLLM."""

from __future__ import annotations

import queue
import time
from collections import defaultdict
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
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


def virtual_clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """A virtual ``time.perf_counter`` for vLLM's code and ours: ``clock["t"]``."""
    now = {"t": 1000.0}
    monkeypatch.setattr(time, "perf_counter", lambda: now["t"])
    return now


class RecordingNixl:
    """A NIXL wrapper that records every notification sent and delivers queued ones."""

    def __init__(self, name: str = "d-agent") -> None:
        self.name = name
        self.sent: list[tuple[str, bytes]] = []
        self.inbox: dict[str, list[bytes]] = {}
        self.removed: list[str] = []

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        self.sent.append((agent_name, bytes(notif_msg)))

    def get_new_notifs(self) -> dict[str, list[bytes]]:
        out, self.inbox = self.inbox, {}
        return out

    def get_agent_metadata(self) -> bytes:
        if self.name == "d-agent":
            return b"\x00agent-metadata\xff"
        return b"meta:" + self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """The agent name the metadata carries (``get_agent_metadata``'s form), as
        bytes: NIXL 1.5's ``add_remote_agent`` returns bytes; notifications are
        keyed by ``str``."""
        self.added = [*getattr(self, "added", []), bytes(metadata)]
        data = bytes(metadata)
        return data[5:] if data.startswith(b"meta:") else b"d-agent"

    def remove_remote_agent(self, agent_name: str) -> None:
        self.removed.append(agent_name)

    def make_prepped_xfer(self, op: str, *args: Any, notif_msg: bytes = b"", **kw: Any) -> int:
        """Records the notification NIXL would deliver once the READ is done."""
        self.xfers = [*getattr(self, "xfers", []), bytes(notif_msg)]
        return len(self.xfers)

    def transfer(self, handle: int) -> str:
        return "PROC"

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
    name: str = "d-agent",
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
    w.nixl_wrapper = RecordingNixl(name)
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
    w._recv_failures = set()
    w._pending_recv_notifs = {}

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


def make_finishing_scheduler(
    ours: bool, engine: str, *, kv_lease_duration: int = 12, bidirectional: bool = False
) -> Any:
    """A scheduler whose ``request_finished`` (vLLM's) can hand out transfer parameters."""
    s = make_scheduler(ours, kv_lease_duration=kv_lease_duration)
    s.engine_id, s.side_channel_host, s.side_channel_port = engine, "h-" + engine, 5600
    s.transfer_tp_size = 1
    s.is_bidirectional_kv_xfer_enabled = bidirectional
    s.vllm_config = SimpleNamespace(
        num_prefill_lookahead_tokens=0,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
    )
    s.kv_cache_config = MagicMock()
    s.kv_cache_config.select_transfer_block_ids = lambda b: b
    return s


def record_reads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """vLLM's NIXL post of one READ, replaced: records what vLLM asked for."""
    calls: list[dict[str, Any]] = []

    def post(self: Any, **kw: Any) -> bool:
        calls.append({"agent": f"p{kw['read_spec'].remote_rank}", "d": self, **kw})
        return True

    monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks", post)
    return calls


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


def topology(engine: str, rank: int, tp: int, remote: str, remote_tp: int) -> Any:
    """vLLM's ``TransferTopology`` of rank ``rank`` of ``engine`` (TP ``tp``),
    handshaken with engine ``remote`` (TP ``remote_tp``), and its TP mapping."""
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        EngineTransferInfo,
        TransferTopology,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import compute_tp_mapping
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    topo = TransferTopology(
        tp_rank=rank,
        tp_size=tp,
        block_size=16,
        engine_id=engine,
        is_mla=False,
        is_mamba=False,
        total_num_kv_heads=8,
        attn_backends=[],
    )
    topo.register_remote_engine(
        remote,
        EngineTransferInfo(
            remote_tp_size=remote_tp,
            remote_block_len=16 * 4096,
            remote_block_size=16,
            remote_physical_blocks_per_logical=1,
        ),
    )
    return topo, compute_tp_mapping(topo, remote_tp, (FullAttentionSpec,))


def make_reader(d_tp: int, d_rank: int, p_tp: int, engine: str = "P0", **kw: Any) -> Any:
    """A D worker (ours) set up so that vLLM's own ``_read_blocks_for_req`` runs:
    a real ``TransferTopology`` and ``compute_tp_mapping`` decide which P ranks
    this D rank reads (and handshakes with, as vLLM's ``handshake_target_ranks``);
    P rank ``r``'s agent is ``f"p{r}"``. Only vLLM's ``_read_blocks`` (the NIXL
    post) is left to the test to replace."""
    topo, mapping = topology("D0", d_rank, d_tp, engine, p_tp)
    targets = topo.handshake_target_ranks(p_tp)
    # bytes, as in vLLM: NIXL's add_remote_agent returns them (notifications name str)
    w = make_worker(True, agents={engine: {(0, r): f"p{r}".encode() for r in targets}}, **kw)
    w.transfer_topo = topo
    w.tp_mappings = {engine: mapping}
    w._invalid_remote_engines = set()
    w._bidirectional_kv_xfer_enabled = False
    w._recving_transfers = {}
    w.dcp_size = 1
    w.dst_region_group_ids = {engine: [0]}
    w.region_group_ids = [0]
    w.use_mla = False
    w._has_mamba = False
    w.src_xfer_handles_by_tp_ratio = {(-(p_tp // d_tp), 16): list(range(p_tp))}
    w.src_xfer_handles_by_block_size = {16: 0}
    w._mixed_mem_types = False
    w.dst_xfer_side_handles = {engine: {r: 100 + r for r in targets}}
    return w


def recv_meta(local_id: str, remote_id: str, engine: str = "P0", p_tp: int = 1) -> Any:
    """vLLM's ``ReqMeta`` for one READ, as its scheduler builds it."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata

    meta = NixlConnectorMetadata()
    meta.add_new_req_to_recv(
        request_id=local_id,
        local_block_ids=([0, 1],),
        kv_transfer_params={
            "remote_block_ids": ([10, 11],),
            "remote_engine_id": engine,
            "remote_request_id": remote_id,
            "remote_host": "p-host",
            "remote_port": 5600,
            "remote_tp_size": p_tp,
        },
    )
    return meta.reqs_to_recv[local_id]
