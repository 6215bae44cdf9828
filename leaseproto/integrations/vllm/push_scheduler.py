"""The scheduler side of :class:`~leaseproto.integrations.vllm.LeaseprotoPushConnector`.

vLLM's push scheduler, with:

- D's heartbeats to P from :class:`~.tracking.HeartbeatTracking` (the same
  tracker as pull mode). They name **D's own request id** (B2: vLLM names the
  router's id, which P never granted); our P maps it to its lease by base id
  (:func:`~.push.base_id`), as vLLM matches registrations.
- D's advertisement in each registration it stages (``"leaseproto"``: the
  capability, ``push_registration_timeout`` as the lease). Once a
  registration is shipped to the worker, the worker's lease holds it: vLLM's
  one-shot watchdog is left only the registrations not shipped yet.
- P's news for its worker (:data:`ALIVE_ATTR`): which of its requests it holds
  (from ``on_new_request`` until the request ends or its blocks are freed),
  so that the worker heartbeats a registration only while P holds its request.
- D's news for its worker (:data:`ABORTED_ATTR`): requests that ended while
  their registration still waited for P's WRITE (vLLM keeps their blocks until
  the receive is reported), so that the worker can end the registration and
  tell a leaseproto P (``LL:`` in answer to its next heartbeat).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_scheduler import (
    NixlPushConnectorScheduler,
)

from .push import registration_advert
from .sidechannel import SideChannelCheck
from .tracking import PARAMS_KEY, HeartbeatTracking

__all__ = ["ABORTED_ATTR", "ALIVE_ATTR", "LeaseprotoPushConnectorScheduler"]

#: Metadata attribute: P request id -> held by the scheduler (True) or let go (False).
ALIVE_ATTR = "leaseproto_push_alive"
#: Metadata attribute: D's requests that ended while their registration waited.
ABORTED_ATTR = "leaseproto_push_aborted"


class LeaseprotoPushConnectorScheduler(
    SideChannelCheck,
    HeartbeatTracking,
    NixlPushConnectorScheduler,  # type: ignore[misc]
):
    """vLLM's push scheduler with the heartbeat tracker, D's advertisement and P's news."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        self._lp_init(vllm_config)  # refuses a bad config at start-up
        super().__init__(vllm_config, engine_id, kv_cache_config)

    def _alive(self) -> dict[str, bool]:
        out: dict[str, bool] = self.__dict__.setdefault("_lp_alive", {})
        return out

    def _waiting(self) -> set[str]:
        """D requests registered whose receive has not been reported yet."""
        out: set[str] = self.__dict__.setdefault("_lp_waiting", set())
        return out

    def _aborted(self) -> set[str]:
        out: set[str] = self.__dict__.setdefault("_lp_aborted", set())
        return out

    def _held(self) -> set[str]:
        """P requests held with a lease armed: let go when their blocks are freed."""
        out: set[str] = self.__dict__.setdefault("_lp_held", set())
        return out

    def on_new_request(self, request: Any) -> None:
        params = request.kv_transfer_params
        if params is not None and params.get("do_remote_decode"):
            self._truncate_request_for_prefill(request)
            self._alive()[request.request_id] = True  # P: its worker renews D for it
            return
        if params is None or not params.get("do_remote_prefill"):
            return
        engine = params.get("remote_engine_id")
        if engine is not None and params.get("remote_request_id") is not None:
            # B2: our own id, which P maps to its lease by base id (vLLM sends the router's)
            self._track(request.request_id, engine, request.request_id, params)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        reg = self._push_pending_registrations.get(request.request_id)
        if reg is not None and PARAMS_KEY not in reg:
            ttl = self.__dict__.get("_push_registration_timeout", 480.0)
            reg[PARAMS_KEY] = registration_advert(self._advert(), ttl)
            self._waiting().add(request.request_id)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        self._quiet()
        try:
            meta = super().build_connector_meta(scheduler_output)
        finally:
            self._loud()
        for rid in meta.push_registrations:  # shipped: the worker's lease holds it now
            self._push_registration_deadlines.pop(rid, None)
        alive, aborted = self._alive(), self._aborted()
        if alive:
            setattr(meta, ALIVE_ATTR, dict(alive))
            alive.clear()
        if aborted:
            setattr(meta, ABORTED_ATTR, set(aborted))
            aborted.clear()
        self._ship_heartbeats(meta)
        return meta

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)
        rid = request.request_id
        if rid in self._waiting():  # D: it ended while its registration waited
            self._waiting().discard(rid)
            self._aborted().add(rid)
        if request.kv_transfer_params and request.kv_transfer_params.get("do_remote_decode"):
            if delay:
                self._held().add(rid)  # P: let go once its blocks are freed
            else:
                self._alive()[rid] = False
        return delay, params

    def update_connector_output(self, connector_output: Any) -> None:
        super().update_connector_output(connector_output)
        self._waiting().difference_update(connector_output.finished_recving or ())
        held = self._held()
        for rid in connector_output.finished_sending or ():
            if rid in held:
                held.discard(rid)
                self._alive()[rid] = False
