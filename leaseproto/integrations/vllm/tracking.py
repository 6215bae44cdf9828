"""The heartbeat side of a connector scheduler, for pull and push alike.

:class:`HeartbeatTracking` is mixed into both of our schedulers (pull:
:class:`~.scheduler.LeaseprotoConnectorScheduler`, push:
:class:`~.push_scheduler.LeaseprotoPushConnectorScheduler`). The core's
:class:`~leaseproto.HeartbeatTracker` is the one record of which grantor
leases this engine keeps alive; vLLM's ``_heartbeat_by_engine`` and
``_heartbeat_req_engine`` are views of it. Each grantor engine has its own
turn (vLLM: one timer for all engines), so :meth:`HeartbeatTracking._ship_heartbeats`
puts into the step's metadata only the engines that are due.

It also builds our advertisement (``kv_transfer_params["leaseproto"]``, or the
push registration's ``"leaseproto"`` key): the lease's durations and, with a
cluster key, its id.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import HeartbeatInfo

from leaseproto import HeartbeatTracker, LeaseConfig, LocalProtocolError, wire

from .config import lease_config_from_extra_config
from .sealing import load_key

__all__ = [
    "AUTH_ATTR",
    "CAPABILITY",
    "ENGINE_AUTH_ATTR",
    "PARAMS_KEY",
    "VERIFY_ATTR",
    "HeartbeatTracking",
    "key_id_of",
]

logger = logging.getLogger("vllm.leaseproto.scheduler")

#: Our capability token (verdicts, LL, AB).
CAPABILITY = wire.CAPABILITY
#: The ``kv_transfer_params`` key P advertises it under (and D's push registration).
PARAMS_KEY = "leaseproto"
#: Metadata attribute: D's requests to read whose P advertised (their reads are verified).
VERIFY_ATTR = "leaseproto_verify"
#: Metadata attribute: those requests -> the cluster key id their P advertised (None: none).
AUTH_ATTR = "leaseproto_auth"
#: Metadata attribute: advertising P engines heartbeated this step -> their key id.
ENGINE_AUTH_ATTR = "leaseproto_engine_auth"


def key_id_of(params: dict[str, Any]) -> str | None:
    """The cluster key id an advertisement in ``params`` names (None: none)."""
    advert = params.get(PARAMS_KEY)
    key = advert.get("auth") if isinstance(advert, dict) else None
    return key if isinstance(key, str) else None


@dataclass(frozen=True)
class _Address:
    """How to reach a grantor engine (vLLM keeps it in ``HeartbeatInfo``)."""

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


def config_of(obj: object) -> LeaseConfig:
    """The lease settings of a scheduler (one built with ``object.__new__`` by
    vLLM's tests too)."""
    duration = obj.__dict__.get("_kv_lease_duration")
    if duration is not None:
        return lease_config_from_extra_config({"kv_lease_duration": duration})
    kv = getattr(getattr(obj, "vllm_config", None), "kv_transfer_config", None)
    return lease_config_from_extra_config(getattr(kv, "kv_connector_extra_config", None))


class HeartbeatTracking:
    """Mixed into our schedulers, before vLLM's class (see the module's docstring)."""

    def _lp_init(self, vllm_config: Any) -> None:
        """Before vLLM's ``__init__``: refuses a bad config or key at start-up."""
        self.vllm_config = vllm_config
        self.__dict__["_lp"] = _Tracking(config_of(self))
        kv = getattr(vllm_config, "kv_transfer_config", None)
        key = load_key(getattr(kv, "kv_connector_extra_config", None))
        self.__dict__["_lp_key_id"] = None if key is None else key.key_id

    def _tracking(self) -> _Tracking:
        lp: _Tracking | None = self.__dict__.get("_lp")
        if lp is None:
            lp = self.__dict__["_lp"] = _Tracking(config_of(self))
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
        self.__dict__["_lp"] = _Tracking(config_of(self))

    @property
    def _heartbeat_req_engine(self) -> dict[str, tuple[str, str]]:
        t = self._tracking().tracker
        return {r: (e, str(t.remote_id(r))) for e in t.engines() for r in t.requests(e)}

    @_heartbeat_req_engine.setter
    def _heartbeat_req_engine(self, value: dict[str, tuple[str, str]]) -> None:
        if value:
            raise ValueError("_heartbeat_req_engine is derived from the heartbeat tracker")

    # -- tracking -------------------------------------------------------------------------
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
                key_id_of(params),
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

    def _quiet(self) -> None:
        """Until :meth:`_ship_heartbeats`: vLLM's own heartbeat code sees no engine."""
        self.__dict__["_lp_quiet"] = True

    def _loud(self) -> None:
        self.__dict__["_lp_quiet"] = False

    def _ship_heartbeats(self, meta: Any) -> None:
        """Put the engines whose turn has come into this step's metadata."""
        lp = self._tracking()
        if not lp.tracker.engines():
            return
        now = lp.now()
        due = lp.tracker.due(now=now)
        if due:
            self.__dict__["_last_heartbeat_time"] = now
            meta.heartbeat_by_engine = {e: lp.info(e, ids) for e, ids in due.items()}
            keyed = {e: lp.addr[e].auth for e in due if lp.addr[e].leaseproto}
            setattr(meta, ENGINE_AUTH_ATTR, keyed)

    # -- our advertisement ----------------------------------------------------------------
    def _advert(self, cfg: LeaseConfig | None = None) -> dict[str, Any]:
        cfg = self._tracking().config if cfg is None else cfg
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
