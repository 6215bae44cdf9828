"""Push-mode schedulers and workers built the way vLLM's tests build them
(``object.__new__`` plus the fields vLLM's push code touches), for stock vLLM
and for LeaseprotoPushConnector, and a pair of them wired back to back: D's
registration reaches P, P's WRITE is posted by vLLM's own code and only the
NIXL post of one WRITE (``_xfer_blocks``) is replaced. Needs vLLM."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import PUSH_REG_NOTIF_PREFIX
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm_stubs import RecordingNixl, topology

from leaseproto.integrations.vllm.push_scheduler import LeaseprotoPushConnectorScheduler
from leaseproto.integrations.vllm.push_worker import LeaseprotoPushConnectorWorker
from leaseproto.integrations.vllm.stats import LeaseprotoKVConnectorStats

P_ID = "cmpl-5e1f-0-aaaaaaaa"  # P's internal id of the request
D_ID = "cmpl-5e1f-0-bbbbbbbb"  # D's: the same base id, another random suffix
ROUTER_ID = "cmpl-5e1f-0"  # what the push proxy hands D as remote_request_id (B2)


def push_scheduler(ours: bool, engine: str, *, ttl: float = 24.0, duration: int = 12) -> Any:
    cls = LeaseprotoPushConnectorScheduler if ours else NixlPushConnectorScheduler
    s = object.__new__(cls)
    s.vllm_config = SimpleNamespace(
        num_prefill_lookahead_tokens=0,
        parallel_config=SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1, pipeline_parallel_size=1
        ),
    )
    s._kv_lease_duration = duration
    s._heartbeat_interval = duration // 6
    s._heartbeat_by_engine = {}
    s._heartbeat_req_engine = {}
    s._last_heartbeat_time = 0.0
    for name in ("_reqs_need_recv", "_reqs_need_send", "_reqs_need_save"):
        setattr(s, name, {})
    s._reqs_in_batch, s._reqs_not_processed = set(), set()
    s.decoder_kv_blocks_ttl = ttl
    s.use_host_buffer = False
    s.engine_id, s.side_channel_host, s.side_channel_port = engine, "h-" + engine, 5600
    s.transfer_tp_size = 1
    s.is_bidirectional_kv_xfer_enabled = False
    s._has_mamba = False
    s._bounded_replay = False
    s._push_pending_registrations, s._push_registration_deadlines = {}, {}
    s._finished_request_blocks, s._newly_finished_push_blocks = {}, {}
    s._push_registration_timeout = ttl
    s.get_exchange_clipped_blocks = lambda block_ids, clip_ssm=True: block_ids
    return s


def push_worker(
    ours: bool,
    engine: str,
    name: str,
    agents: dict[str, dict[tuple[int, int], Any]],
    *,
    extra: dict[str, Any] | None = None,
    tp: int = 1,
    rank: int = 0,
) -> Any:
    cls = LeaseprotoPushConnectorWorker if ours else NixlPushConnectorWorker
    w = object.__new__(cls)
    w.vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config={"kv_lease_duration": 12, **(extra or {})}
        )
    )
    w._sending_transfers = defaultdict(list)
    w._send_failures = set()
    w._sending_transfers_lock = threading.Lock()
    w._push_finished_blocks, w._pending_d_registrations = {}, {}
    for q in ("_reg_send_inbox", "_finished_blocks_inbox", "_pending_completion_notifs"):
        setattr(w, q, queue.Queue())
    w._evict_finished_inbox, w._deferred_push_inbox = queue.Queue(), queue.Queue()
    w._push_writer_wake, w._push_writer_stop = threading.Event(), threading.Event()
    w._push_writer_thread = None
    w._recving_metadata, w._pending_recv_notifs = {}, {}
    w._failed_recv_reqs, w._invalid_block_ids = queue.Queue(), queue.Queue()
    w._recv_failures, w._replicated_pcp_done_sending = set(), set()
    w._recving_transfers = defaultdict(list)
    w._is_hma_required = False
    w.xfer_stats = LeaseprotoKVConnectorStats() if ours else NixlKVConnectorStats()
    w._reqs_to_process = set()
    w._reqs_to_send = {}
    w._lease_extension = 8
    w.consumer_notification_counts_by_req = defaultdict(int)
    w.expected_consumer_notifications_by_req = {}
    w.tp_rank, w.world_size, w.pp_size, w.pcp_rank, w.pcp_dcp_sharded = rank, tp, 1, 0, False
    w.engine_id = engine
    w._remote_agents = agents
    w._failed_remote_engines, w._invalid_remote_engines = set(), set()
    w._handshake_lock = threading.RLock()
    w._physical_blocks_per_logical_kv_block = 1
    w._engine_ttl, w._engine_last_active, w._engine_by_address = 0.0, {}, {}
    w._hb_handshake_notif_only = True
    w.use_host_buffer = w.use_mla = w._has_mamba = w._is_csa_linear = False
    w.enable_permute_local_kv = w.enable_heterogeneous_attn_post_process = False
    w._transfer_layer_group_ids = ()
    w.region_group_ids = [0]
    w._group_spec_types = (FullAttentionSpec,)
    w.transfer_topo = MagicMock()
    w.transfer_topo.block_size_ratio.return_value = 1
    w.transfer_topo.get_engine_info.return_value.remote_physical_blocks_per_logical = 1
    w.nixl_wrapper = RecordingNixl(name)
    if ours:
        w.__dict__["_lp_route"] = True  # the writer's polls go through our router
    w._pending = set()  # engines whose handshake is still pending

    def ensure(engine_id: str, *args: Any, **kw: Any) -> Future[Any] | None:
        return Future() if engine_id in w._pending else None

    w._ensure_handshake = ensure
    return w


def as_writer(w: Any, d_engine: str, d_tp: int) -> None:
    """Make P worker ``w`` able to run vLLM's ``_xfer_blocks_for_req``: a real
    topology and TP mapping towards D's engine."""
    topo, mapping = topology(w.engine_id, w.tp_rank, w.world_size, d_engine, d_tp)
    w.transfer_topo = topo
    w.tp_mappings = {d_engine: mapping}
    w.dst_region_group_ids = {d_engine: [0]}
    ranks = topo.handshake_target_ranks(d_tp)
    w.dst_xfer_side_handles = {d_engine: {r: 100 + r for r in ranks}}
    w.src_xfer_handles_by_block_size = {16: 0}
    w.src_xfer_handles_by_tp_ratio = {}


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """vLLM's NIXL post of one WRITE, replaced: records it and posts its
    completion the way vLLM's ``_xfer_blocks`` does (``<D's id>:<P's TP>``)."""
    calls: list[dict[str, Any]] = []

    def post(self: Any, **kw: Any) -> int:
        msg = f"{kw['remote_request_id']}:{self.world_size}".encode()
        handle = self.nixl_wrapper.make_prepped_xfer("WRITE", notif_msg=msg)
        self.nixl_wrapper.transfer(handle)
        calls.append({"p": self, "msg": msg, **kw})
        return int(handle)

    monkeypatch.setattr(NixlPushConnectorWorker, "_xfer_blocks", post)
    return calls


def writer_pass(w: Any) -> None:
    """One turn of vLLM's ``nixl-push-writer`` loop, in its order, on this thread."""
    while not w._reg_send_inbox.empty():
        w._send_registration_to_p(*w._reg_send_inbox.get_nowait())
    while not w._deferred_push_inbox.empty():
        w._do_start_push_kv(*w._deferred_push_inbox.get_nowait())
    while not w._finished_blocks_inbox.empty():
        rid, blocks = w._finished_blocks_inbox.get_nowait()
        matched = w._pop_matching_registration(rid)
        if matched is not None:
            w._do_start_push_kv(rid, blocks, matched)
        else:
            w._push_finished_blocks[rid] = blocks
    while not w._evict_finished_inbox.empty():
        rid = w._evict_finished_inbox.get_nowait()
        w._push_finished_blocks.pop(rid, None)
        w._pending_d_registrations.pop(rid, None)
    for notifs in w.nixl_wrapper.get_new_notifs().values():
        for notif in notifs:
            if bytes(notif).startswith(PUSH_REG_NOTIF_PREFIX):
                w._handle_push_reg_notif(notif)
            else:
                w._pending_completion_notifs.put(notif)


def carry(src: Any, dst: Any, *, keep: Any = None) -> list[bytes]:
    """Deliver what ``src`` sent (and the completions of its WRITEs) to ``dst``."""
    msgs = [m for _, m in src.nixl_wrapper.sent]
    msgs += getattr(src.nixl_wrapper, "xfers", [])
    src.nixl_wrapper.sent, src.nixl_wrapper.xfers = [], []
    msgs = [m for m in msgs if keep is None or keep(m)]
    dst.nixl_wrapper.deliver(src.nixl_wrapper.name, *msgs)
    return msgs


@dataclass
class Pair:
    """A D and a P engine (one rank each), with their schedulers."""

    d_sched: Any
    d: Any
    p_sched: Any
    p: Any
    clock: dict[str, float]
    #: requests as each side holds them, by id (vLLM's code changes their parameters)
    requests: dict[str, Any] = field(default_factory=dict)

    def p_admits(self, request: Any) -> None:
        """The request enters P's queue (the proxy sends it to P and D at once)."""
        self.requests[request.request_id] = request
        self.p_sched.on_new_request(request)

    def d_admits(self, request: Any) -> None:
        """The request enters D's queue and D allocates its blocks: the registration."""
        self.requests[request.request_id] = request
        self.d_sched.on_new_request(request)
        self.d_sched.update_state_after_alloc(request, Blocks(([3, 4],)), num_external_tokens=32)

    def d_step(self) -> tuple[set[str], set[str]]:
        """One step of D's engine: build the metadata, start_load_kv, the writer,
        then vLLM's get_transfer_results: (finished_recving, failed_recving)."""
        self.d.start_load_kv(self.d_sched.build_connector_meta(MagicMock()))
        writer_pass(self.d)
        res = self.d.get_transfer_results()
        self.d_sched.update_connector_output(
            SimpleNamespace(
                finished_recving=res.finished_recving, finished_sending=res.finished_sending
            )
        )
        return set(res.finished_recving), set(res.failed_recving)

    def p_step(self) -> set[str]:
        """One step of P's engine; returns finished_sending (P's blocks freed)."""
        self.p.start_load_kv(self.p_sched.build_connector_meta(MagicMock()))
        writer_pass(self.p)
        res = self.p.get_transfer_results()
        self.p_sched.update_connector_output(
            SimpleNamespace(finished_recving=set(), finished_sending=res.finished_sending)
        )
        return set(res.finished_sending)

    def p_prefill_done(self, request: Any, blocks: tuple[list[int], ...] = ([7, 8],)) -> None:
        """P's prefill of ``request`` ends: vLLM's request_finished grants the lease."""
        from vllm.v1.request import RequestStatus

        self.p_sched.update_state_after_alloc(request, Blocks(blocks), num_external_tokens=0)
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.p_sched.request_finished(request, blocks)


class Blocks:
    def __init__(self, ids: tuple[list[int], ...]) -> None:
        self.ids = ids

    def get_unhashed_block_ids_all_groups(self) -> tuple[list[int], ...]:
        return self.ids


def d_request(router_id: str = ROUTER_ID, d_id: str = D_ID) -> Any:
    """A push request entering D: the proxy names P's engine and its own id."""
    return SimpleNamespace(
        request_id=d_id,
        kv_transfer_params={
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": "P0",
            "remote_request_id": router_id,
            "remote_host": "h-P0",
            "remote_port": 5600,
            "tp_size": 1,
        },
    )


def p_request(p_id: str = P_ID) -> Any:
    return SimpleNamespace(
        request_id=p_id,
        num_computed_tokens=32,
        status=None,
        kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False},
    )


def make_pair(clock: dict[str, float], *, d_ours: bool = True, p_ours: bool = True) -> Pair:
    """D engine ``DEC`` (agent ``d0``) and P engine ``P0`` (agent ``p0``), TP 1,
    each handshaken with the other; ``kv_lease_duration`` 12 (extension 8),
    ``push_registration_timeout`` 24."""
    d = push_worker(d_ours, "DEC", "d0", {"P0": {(0, 0): b"p0"}})
    p = push_worker(p_ours, "P0", "p0", {"DEC": {(0, 0): b"d0"}})
    as_writer(p, "DEC", 1)
    return Pair(push_scheduler(d_ours, "DEC"), d, push_scheduler(p_ours, "P0"), p, clock)
