"""The scheduler side of :class:`~leaseproto.integrations.vllm.LeaseprotoConnector`.

D: :class:`~leaseproto.HeartbeatTracker` is the one record of which P leases
this engine keeps alive (:class:`~.tracking.HeartbeatTracking`, shared with
the push scheduler); vLLM's ``_heartbeat_by_engine`` and
``_heartbeat_req_engine`` are views of it, and ``build_connector_meta`` ships
only the engines that are due.

P: the transfer parameters handed to D advertise ``leaseproto/1`` and the
lease's durations (``kv_transfer_params["leaseproto"]``), and with a cluster
key its id (``"auth"``); a stock D ignores the key. D passes the key id each
P advertised on to its workers (:data:`~.tracking.AUTH_ATTR`, :data:`~.tracking.ENGINE_AUTH_ATTR`).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)

from .bidirectional import is_cached_turn, turn2_heartbeat_target, turn_advert
from .idle import IDLE_ATTR
from .sidechannel import SideChannelCheck
from .tracking import AUTH_ATTR, PARAMS_KEY, VERIFY_ATTR, HeartbeatTracking, key_id_of

__all__ = ["LeaseprotoConnectorScheduler"]


class LeaseprotoConnectorScheduler(SideChannelCheck, HeartbeatTracking, NixlPullConnectorScheduler):  # type: ignore[misc]
    """vLLM's pull scheduler with the heartbeat tracker as the one record on D."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        self._lp_init(vllm_config)  # refuses a bad config at start-up
        super().__init__(vllm_config, engine_id, kv_cache_config)

    # -- D: tracking ----------------------------------------------------------------------
    def on_new_request(self, request: Any) -> None:
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_decode"):
            self._truncate_request_for_prefill(request)
            turn2 = turn2_heartbeat_target(params, PARAMS_KEY)
            if turn2 is not None and self.__dict__.get("is_bidirectional_kv_xfer_enabled"):
                self._track(request.request_id, *turn2, params)  # P heartbeats D (I16)
            return
        if params is None or not params.get("do_remote_prefill"):
            return
        engine = params.get("remote_engine_id")
        remote = params.get("remote_request_id")
        if engine is None or remote is None:
            return
        self._track(request.request_id, engine, remote, params)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        advertised = {
            rid: key_id_of(params)
            for rid, entry in self._reqs_need_recv.items()
            if PARAMS_KEY in (params := entry[0].kv_transfer_params or {})
        }
        self._quiet()
        try:
            meta = super().build_connector_meta(scheduler_output)
        finally:
            self._loud()
        setattr(meta, VERIFY_ATTR, set(advertised))
        setattr(meta, AUTH_ATTR, advertised)
        # nothing to compute: the worker may poll notifications before the step ends (.idle)
        setattr(meta, IDLE_ATTR, not getattr(scheduler_output, "total_num_scheduled_tokens", 1))
        self._ship_heartbeats(meta)
        return meta

    # -- P: one turn-2 read per request ----------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """vLLM's count, except for a turn-2 request (D's transfer parameters)
        that P will not read: (0, False), so P prefills it locally.

        vLLM 0.32 answers such a request with D's token count, to be loaded
        asynchronously, so the request is parked in WAITING_FOR_REMOTE_KVS; but
        ``update_state_after_alloc`` sets up a read only once per request
        (``_remote_blocks_processed``), only in bidirectional mode and never with
        a host buffer (``use_host_buffer``). It asks again whenever the request
        is back to no computed tokens: after a failed read under
        ``kv_load_failure_policy = "recompute"`` (an ``NK:``, no verdict in time,
        a failed handshake or READ) and after a preemption. No read then ends
        the wait and the request hangs (seen on real engines,
        ``tests/test_vllm_pd.py``). The first ask already hangs on a P without
        ``bidirectional_kv_xfer`` or with a host buffer."""
        params = request.kv_transfer_params
        if (
            params is not None
            and params.get("do_remote_decode")
            and not params.get("do_remote_prefill")
            and (
                params.get("_remote_blocks_processed")
                or not self.__dict__.get("is_bidirectional_kv_xfer_enabled")
                or self.__dict__.get("use_host_buffer")
            )
        ):
            return 0, False
        count: tuple[int | None, bool] = super().get_num_new_matched_tokens(
            request, num_computed_tokens
        )
        return count

    # -- P: advertise ---------------------------------------------------------------------
    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)
        if params is not None and params.get("do_remote_prefill"):
            params[PARAMS_KEY] = self._advert()
        elif params is not None and delay and is_cached_turn(params):
            # D, bidirectional: the cached turn is a lease in our worker's table (I14)
            ttl = self.__dict__.get("decoder_kv_blocks_ttl", 480)
            params[PARAMS_KEY] = turn_advert(self._advert(), ttl)
        return delay, params
