"""The scheduler side of :class:`~leaseproto.integrations.vllm.LeaseprotoConnector`.

D: :class:`~leaseproto.HeartbeatTracker` is the one record of which P leases
this engine keeps alive; vLLM's ``_heartbeat_by_engine`` and
``_heartbeat_req_engine`` are views of it. Each P engine has its own turn
(vLLM: one timer for all engines), so ``build_connector_meta`` ships only the
engines that are due.

P: the transfer parameters handed to D advertise ``leaseproto/1`` and the
lease's durations (``kv_transfer_params["leaseproto"]``), and with a cluster
key its id (``"auth"``); a stock D ignores the key. D passes the key id each
P advertised on to its workers (:data:`AUTH_ATTR`, :data:`ENGINE_AUTH_ATTR`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import HeartbeatInfo
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)

from leaseproto import HeartbeatTracker, LeaseConfig, LocalProtocolError, wire

from .bidirectional import is_cached_turn, turn2_heartbeat_target, turn_advert
from .config import lease_config_from_extra_config
from .sealing import load_key

__all__ = [
    "AUTH_ATTR",
    "CAPABILITY",
    "ENGINE_AUTH_ATTR",
    "PARAMS_KEY",
    "VERIFY_ATTR",
    "LeaseprotoConnectorScheduler",
]

logger = logging.getLogger("vllm.leaseproto.scheduler")

#: Our capability token (verdicts, LL, AB).
CAPABILITY = wire.CAPABILITY
#: The ``kv_transfer_params`` key P advertises it under.
PARAMS_KEY = "leaseproto"
#: Metadata attribute: D's requests to read whose P advertised (their reads are verified).
VERIFY_ATTR = "leaseproto_verify"
#: Metadata attribute: those requests -> the cluster key id their P advertised (None: none).
AUTH_ATTR = "leaseproto_auth"
#: Metadata attribute: advertising P engines heartbeated this step -> their key id.
ENGINE_AUTH_ATTR = "leaseproto_engine_auth"


def _key_id(params: dict[str, Any]) -> str | None:
    advert = params.get(PARAMS_KEY)
    key = advert.get("auth") if isinstance(advert, dict) else None
    return key if isinstance(key, str) else None


@dataclass(frozen=True)
class _Address:
    """How to reach a P engine (vLLM keeps it in ``HeartbeatInfo``)."""

    host: str
    port: int
    tp_size: int
    dcp_size: int
    pp_size: int
    leaseproto: bool
    auth: str | None = None


class _Tracking:
    """The tracker, the monotone clock, and each engine's address (first request seen)."""

    def __init__(self, config: LeaseConfig) -> None:
        self.config = config
        self.tracker = HeartbeatTracker(config)
        self.addr: dict[str, _Address] = {}
        self.last = -math.inf

    def now(self) -> float:
        self.last = max(self.last, time.perf_counter())
        return self.last

    def info(self, engine: str, remote_ids: list[str]) -> HeartbeatInfo:
        a = self.addr[engine]
        return HeartbeatInfo(
            req_ids=set(remote_ids),
            host=a.host,
            port=a.port,
            tp_size=a.tp_size,
            dcp_size=a.dcp_size,
            pp_size=a.pp_size,
        )


def _config_of(obj: object) -> LeaseConfig:
    duration = obj.__dict__.get("_kv_lease_duration")
    if duration is not None:  # a scheduler built with object.__new__ (vLLM's tests)
        return lease_config_from_extra_config({"kv_lease_duration": duration})
    kv = getattr(getattr(obj, "vllm_config", None), "kv_transfer_config", None)
    return lease_config_from_extra_config(getattr(kv, "kv_connector_extra_config", None))


class LeaseprotoConnectorScheduler(NixlPullConnectorScheduler):  # type: ignore[misc]
    """vLLM's pull scheduler with the heartbeat tracker as the one record on D."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        self.vllm_config = vllm_config
        self._lp = _Tracking(_config_of(self))  # refuses a bad config at start-up
        kv = getattr(vllm_config, "kv_transfer_config", None)
        key = load_key(getattr(kv, "kv_connector_extra_config", None))
        self._lp_key_id = None if key is None else key.key_id
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._lp_quiet = False

    def _tracking(self) -> _Tracking:
        lp: _Tracking | None = self.__dict__.get("_lp")
        if lp is None:
            lp = self.__dict__["_lp"] = _Tracking(_config_of(self))
        return lp

    # -- vLLM's views ---------------------------------------------------------------------
    @property
    def _heartbeat_by_engine(self) -> dict[str, HeartbeatInfo]:
        lp = self._tracking()
        if self.__dict__.get("_lp_quiet"):
            return {}  # vLLM's global throttle in build_connector_meta sees nothing to send
        t = lp.tracker
        return {e: lp.info(e, [str(t.remote_id(r)) for r in t.requests(e)]) for e in t.engines()}

    @_heartbeat_by_engine.setter
    def _heartbeat_by_engine(self, value: dict[str, HeartbeatInfo]) -> None:
        if value:
            raise ValueError(
                "_heartbeat_by_engine is derived from the heartbeat tracker; "
                "track requests with on_new_request"
            )
        self.__dict__["_lp"] = _Tracking(_config_of(self))

    @property
    def _heartbeat_req_engine(self) -> dict[str, tuple[str, str]]:
        t = self._tracking().tracker
        return {r: (e, str(t.remote_id(r))) for e in t.engines() for r in t.requests(e)}

    @_heartbeat_req_engine.setter
    def _heartbeat_req_engine(self, value: dict[str, tuple[str, str]]) -> None:
        if value:
            raise ValueError("_heartbeat_req_engine is derived from the heartbeat tracker")

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

    def _track(self, req_id: str, engine: str, remote: str, params: dict[str, Any]) -> None:
        """Heartbeat the grantor ``engine`` for ``req_id`` (its id there: ``remote``)."""
        host, port, tp = params.get("remote_host"), params.get("remote_port"), params.get("tp_size")
        if host is None or port is None or tp is None:
            return
        lp = self._tracking()
        if req_id in lp.tracker:
            return
        if engine not in lp.addr:
            lp.addr[engine] = _Address(
                host,
                port,
                tp,
                params.get("dcp_size", 1),
                params.get("pp_size", 1),
                PARAMS_KEY in params,
                _key_id(params),
            )
        try:
            lp.tracker.track(req_id, engine_id=engine, remote_req_id=remote, now=lp.now())
        except LocalProtocolError as exc:  # an id no heartbeat can carry: its lease lapses
            logger.error("Not heartbeating request %s: %s", req_id, exc)

    def _stop_heartbeat(self, req_id: str) -> None:
        lp = self._tracking()
        engine = lp.tracker.engine_of(req_id)
        lp.tracker.untrack(req_id)
        if engine is not None and engine not in lp.tracker.engines():
            lp.addr.pop(engine, None)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        advertised = {
            rid: _key_id(params)
            for rid, entry in self._reqs_need_recv.items()
            if PARAMS_KEY in (params := entry[0].kv_transfer_params or {})
        }
        self._lp_quiet = True
        try:
            meta = super().build_connector_meta(scheduler_output)
        finally:
            self._lp_quiet = False
        setattr(meta, VERIFY_ATTR, set(advertised))
        setattr(meta, AUTH_ATTR, advertised)
        lp = self._tracking()
        if lp.tracker.engines():
            now = lp.now()
            due = lp.tracker.due(now=now)
            if due:
                self._last_heartbeat_time = now
                meta.heartbeat_by_engine = {e: lp.info(e, ids) for e, ids in due.items()}
                keyed = {e: lp.addr[e].auth for e in due if lp.addr[e].leaseproto}
                setattr(meta, ENGINE_AUTH_ATTR, keyed)
        return meta

    # -- P: advertise ---------------------------------------------------------------------
    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        delay, params = super().request_finished(request, block_ids)
        if params is not None and params.get("do_remote_prefill"):
            cfg = self._tracking().config
            params[PARAMS_KEY] = self._advert(cfg)
        elif params is not None and delay and is_cached_turn(params):
            # D, bidirectional: the cached turn is a lease in our worker's table (I14)
            ttl = self.__dict__.get("decoder_kv_blocks_ttl", 480)
            params[PARAMS_KEY] = turn_advert(self._advert(self._tracking().config), ttl)
        return delay, params

    def _advert(self, cfg: LeaseConfig) -> dict[str, Any]:
        advert: dict[str, Any] = {
            "v": 1,
            "lease": {
                "kv_lease_duration": cfg.kv_lease_duration,
                "heartbeat_interval": cfg.heartbeat_interval,
                "lease_extension": cfg.lease_extension,
            },
        }
        key_id = self.__dict__.get("_lp_key_id")
        if key_id is not None:  # the reader seals what it sends us, and refuses us without it
            advert["auth"] = key_id
        return advert
