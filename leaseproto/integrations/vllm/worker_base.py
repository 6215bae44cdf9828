"""What both of our workers (pull and push) add to vLLM's NIXL worker.

:class:`LeaseWorker` is mixed in before vLLM's class. It holds:

- the lease record, :class:`~.leases.WorkerLeases`, the core's ``LeaseTable``
  (vLLM's ``_reqs_to_send`` is a view of it), and the expiry of its leases;
- the NIXL agent vLLM's code sees (``nixl_wrapper``): with a cluster key behind
  :class:`~.sealing.SealedNixl`, with ``trace_dir`` behind
  :class:`~.trace.TracedNixl`;
- heartbeats to the grantors this engine renews: split at
  ``max_notification_bytes``; one whose engine's handshake is still pending is
  held and sent on the first step after it completes (vLLM drops it until the
  next interval);
- the hello that tells a grantor which advertised ``leaseproto/1`` that we take
  its verdicts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    HeartbeatInfo,
    NixlConnectorMetadata,
)

from leaseproto import LeaseConfig, Release, wire
from leaseproto.core.mac import FRAME_OVERHEAD, ClusterKey
from leaseproto.core.mac_peers import PeerAuth

from .amx import request_amx_tiles
from .config import lease_config_from_extra_config
from .leases import LeaseView, WorkerLeases
from .sealing import SealedNixl, announce, load_key
from .stats import LeaseprotoKVConnectorStats
from .trace import TracedNixl, open_connector_trace
from .tracking import ENGINE_AUTH_ATTR
from .verify import agent_name, encode_hello

if TYPE_CHECKING:
    from leaseproto.adapters.droplog import DropLog

__all__ = ["LeaseWorker", "extra_of"]

logger = logging.getLogger("vllm.leaseproto.worker")


def extra_of(obj: object) -> Any:
    """A worker's ``kv_connector_extra_config``."""
    kv = getattr(getattr(obj, "vllm_config", None), "kv_transfer_config", None)
    return getattr(kv, "kv_connector_extra_config", None)


def _config_of(obj: object) -> LeaseConfig:
    return lease_config_from_extra_config(extra_of(obj))


def _on_cpu(vllm_config: Any) -> bool:
    return getattr(getattr(vllm_config, "device_config", None), "device_type", None) == "cpu"


class LeaseWorker:
    """Mixed into our workers, before vLLM's class (see the module's docstring)."""

    xfer_stats: Any
    _remote_agents: dict[str, dict[tuple[int, int], Any]]
    _engine_last_active: dict[str, float]
    _hb_handshake_notif_only: bool

    if TYPE_CHECKING:  # NotificationHandling's, and vLLM's

        def _drops(self) -> DropLog: ...

        def _answer(self, agent: str, msg: wire.Message) -> None: ...

        def _released(self, release: Release, done: set[str]) -> None: ...

        def _prune_bindings(self) -> None: ...

        def _forget_silent_decoders(self) -> None: ...

        def _ensure_handshake(self, engine_id: str, *args: Any) -> Any: ...

    def _lp_before_init(self, vllm_config: Any, engine_id: str, name: str) -> LeaseConfig:
        """Before vLLM's ``__init__``: refuses a bad config or key before NIXL starts."""
        self.vllm_config = vllm_config
        config = _config_of(self)
        if _on_cpu(vllm_config):
            request_amx_tiles()  # before any forward: vLLM's AMX attention needs them
        key = self._cluster_key()
        least = wire.MAX_ID_BYTES + wire.VERDICT_OVERHEAD + FRAME_OVERHEAD
        if key is not None and config.max_notification_bytes < least:
            raise ValueError(
                f"with a cluster_key_file, max_notification_bytes must be at least {least} "
                f"(the longest verdict plus the {FRAME_OVERHEAD}-byte frame), got "
                f"{config.max_notification_bytes}"
            )
        announce(f"{name} worker (engine {engine_id})", key)
        self.__dict__["_lp"] = WorkerLeases(config)
        return config

    def _lp_after_init(
        self,
        vllm_config: Any,
        engine_id: str,
        config: LeaseConfig,
        *,
        grant_kind: str,
        producer: bool,
        trace_config: dict[str, Any] | None = None,
    ) -> None:
        """After vLLM's ``__init__``: our settings, stats and trace."""
        lp = self._leases()
        lp.config = lp.table.config = config  # vLLM's __init__ set its own extension
        self.xfer_stats = LeaseprotoKVConnectorStats()
        lp.grant_kind = grant_kind
        lp.trace = open_connector_trace(
            extra_of(self),
            producer=producer,
            engine=engine_id,
            rank=int(getattr(self, "tp_rank", 0)),
            tp=int(getattr(self, "world_size", 1)),
            agent=agent_name(getattr(self.__dict__.get("_lp_nixl"), "name", "")),
            config=config,
            trace_config=trace_config,
        )

    # -- state (also reachable on workers built with object.__new__, as vLLM's tests do) ---
    def _leases(self) -> WorkerLeases:
        lp: WorkerLeases | None = self.__dict__.get("_lp")
        if lp is None:
            lp = self.__dict__["_lp"] = WorkerLeases(_config_of(self))
        return lp

    def _cluster_key(self) -> ClusterKey | None:
        if "_lp_key" not in self.__dict__:
            self.__dict__["_lp_key"] = load_key(extra_of(self))
        key: ClusterKey | None = self.__dict__["_lp_key"]
        return key

    @property
    def nixl_wrapper(self) -> Any:
        """vLLM's NIXL agent; with a cluster key, the same behind
        :class:`~.sealing.SealedNixl`, so vLLM's own sends are sealed too."""
        try:
            raw = self.__dict__["_lp_nixl"]
        except KeyError:
            raise AttributeError("nixl_wrapper") from None
        key = self._cluster_key()
        if key is not None:
            raw = self._sealed(raw, key)
        raw = self._wrap_inner(raw)
        trace = self._leases().trace
        if not trace.enabled:
            return raw
        traced: TracedNixl | None = self.__dict__.get("_lp_traced")
        if traced is None or traced.inner is not raw:
            traced = self.__dict__["_lp_traced"] = TracedNixl(raw, trace)
        return traced

    @nixl_wrapper.setter
    def nixl_wrapper(self, value: Any) -> None:
        self.__dict__["_lp_nixl"] = value

    def _wrap_inner(self, wrapper: Any) -> Any:
        """What goes between the (sealed) agent and the trace: push mode's router."""
        return wrapper

    def _sealed(self, raw: Any, key: ClusterKey) -> SealedNixl:
        sealed: SealedNixl | None = self.__dict__.get("_lp_sealed")
        if sealed is None or sealed.inner is not raw:
            sealed = self.__dict__["_lp_sealed"] = SealedNixl(
                raw,
                PeerAuth(key, agent_name(raw.name)),
                drops=self._drops(),
                stat=self._stat,
                defer=self._defer_transfer_done,
            )
        return sealed

    def _auth(self) -> PeerAuth | None:
        """This agent's keyed connections (None without a key)."""
        wrapper = self._sealed_wrapper()
        return None if wrapper is None else wrapper.auth

    def _sealed_wrapper(self) -> SealedNixl | None:
        wrapper = self.nixl_wrapper
        if isinstance(wrapper, TracedNixl):
            wrapper = wrapper.inner
        return wrapper if isinstance(wrapper, SealedNixl) else None

    def _defer_transfer_done(self, req_id: str, agent: str, msg: bytes) -> None:
        pending = self.__dict__.setdefault("_pending_recv_notifs", {})
        pending.setdefault(req_id, []).append((agent, msg))

    def _lp_set(self, name: str) -> set[str]:
        out: set[str] = self.__dict__.setdefault(name, set())
        return out

    def _deferred(self) -> dict[str, HeartbeatInfo]:
        out: dict[str, HeartbeatInfo] = self.__dict__.setdefault("_lp_deferred", {})
        return out

    @property
    def _reqs_to_send(self) -> LeaseView:
        return LeaseView(self._leases())

    @_reqs_to_send.setter
    def _reqs_to_send(self, deadlines: dict[str, float]) -> None:
        self._leases().reset(deadlines)

    @property
    def _lease_extension(self) -> float:
        return self._leases().config.lease_extension

    @_lease_extension.setter
    def _lease_extension(self, value: float) -> None:
        lp = self._leases()
        if value != lp.config.lease_extension:
            lp.config = lp.table.config = dataclasses.replace(lp.config, lease_extension=value)

    def _stat(self, key: str, n: int = 1) -> None:
        stats = getattr(self, "xfer_stats", None)
        if isinstance(stats, LeaseprotoKVConnectorStats):
            stats.add(key, n)

    # -- P: expiry --------------------------------------------------------------------------
    def _reap_expired_send_leases(self, done_sending: set[str]) -> None:
        lp = self._leases()
        self._stat("lp_leases_granted", lp.take_granted())
        early: dict[str, list[str]] = self.__dict__.get("_lp_early", {})
        for release in lp.take_settled():
            for agent in early.pop(release.req_id, ()):
                self._answer(agent, wire.Ok(release.req_id))
            self._released(release, done_sending)
        for req_id in lp.take_refused():
            getattr(self, "_reqs_to_process", set()).discard(req_id)
            done_sending.add(req_id)
        for release in lp.reap():
            self._expired(release, done_sending)
        now = lp.now()
        if now - self.__dict__.get("_lp_pruned", -1.0e18) >= 1.0:
            self.__dict__["_lp_pruned"] = now
            self._prune_bindings()
            self._forget_silent_decoders()

    def _expired(self, release: Release, done_sending: set[str]) -> None:
        """A lease of our table ended by expiry: vLLM's line and metric, blocks freed."""
        readers = self._leases().readers_done(release.req_id)
        self.xfer_stats.record_kv_expired_req()
        logger.warning(
            "Releasing expired KV blocks for request %s which were retrieved "
            "by %d remote worker(s) before lease expired.",
            release.req_id,
            readers,
        )
        self._released(release, done_sending)

    # -- heartbeats to the grantors we renew ------------------------------------------------
    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        deferred = self._deferred()
        due = {**deferred, **metadata.heartbeat_by_engine}
        deferred.clear()
        max_bytes = self._leases().config.max_notification_bytes
        key = self._cluster_key()
        if key is not None:
            max_bytes -= FRAME_OVERHEAD
        keyed = getattr(metadata, ENGINE_AUTH_ATTR, {})
        for engine_id, info in due.items():
            pending = self._ensure_handshake(
                engine_id,
                info.host,
                info.port,
                info.tp_size,
                info.dcp_size,
                info.pp_size,
                self._hb_handshake_notif_only and info.pp_size > 1,
            )
            if pending is not None:
                deferred[engine_id] = info  # keeps its turn: sent once the handshake is done
                self._stat("lp_heartbeats_deferred")
                continue
            self._engine_last_active[engine_id] = time.perf_counter()
            if key is not None and keyed.get(engine_id) == key.key_id:
                self._hello(engine_id)  # sealed heartbeats wait for P's answer to it
            payloads = self._encode_heartbeat(info.req_ids, max_bytes)
            for agent in self._remote_agents[engine_id].values():
                self._before_heartbeat(engine_id, agent)
                for payload in payloads:
                    try:
                        self.nixl_wrapper.send_notif(agent, notif_msg=payload)
                        self._sent_to(agent)
                        self._stat("lp_heartbeats_sent")
                    except Exception:
                        self._stat("lp_heartbeat_send_failures")
                        self._unsent(agent_name(agent))
                        logger.debug(
                            "Failed to send heartbeat to engine %s", engine_id, exc_info=True
                        )

    def _before_heartbeat(self, engine: str, agent: str | bytes) -> None:
        """Called before each heartbeat to ``agent`` of ``engine`` (push mode's P
        names its capability)."""

    def _unsent(self, agent: str) -> None:
        """A notification to ``agent`` could not be sent (push mode's D forgets it)."""

    @staticmethod
    def _encode_heartbeat(ids: set[str], max_bytes: int) -> list[bytes]:
        good = []
        for rid in sorted(ids):
            try:
                wire.check_id(rid)
            except ValueError as exc:
                logger.warning("Not heartbeating request %r: %s", rid, exc)
                continue
            good.append(rid)
        return wire.encode_heartbeat(good, max_bytes=max_bytes)

    def _greeted(self) -> dict[str, float]:
        """P agent -> when this worker last sent it anything (hello, heartbeat, READ)."""
        out: dict[str, float] = self.__dict__.setdefault("_lp_greeted", {})
        return out

    def _sent_to(self, raw: str | bytes) -> None:
        greeted = self._greeted()
        agent = agent_name(raw)
        if agent in greeted:
            greeted[agent] = self._leases().now()

    def _hello(self, engine: str) -> None:
        """Greet every agent of an advertised P engine (see :meth:`_hello_agent`)."""
        for agent in getattr(self, "_remote_agents", {}).get(engine, {}).values():
            self._hello_agent(agent_name(agent))

    def _hello_agent(self, agent: str) -> None:
        """Tell an advertised P agent that we understand its verdicts: once, and
        again after half its ``tombstone_ttl`` of silence from us (P forgets a
        decoder silent for ``tombstone_ttl``) or after it left a verdict out."""
        greeted = self._greeted()
        now = self._leases().now()
        ttl = self._leases().config.tombstone_ttl
        last = greeted.get(agent)
        if last is not None and now - last < ttl / 2:
            return
        if len(greeted) > 64:  # entries that old are as good as absent
            for a in [a for a, t in greeted.items() if now - t >= ttl / 2]:
                del greeted[a]
        try:
            self.nixl_wrapper.send_notif(
                agent, notif_msg=encode_hello(self.nixl_wrapper.get_agent_metadata())
            )
            greeted[agent] = now
        except Exception as exc:
            self._drops().drop("unsent hello", f"to prefill agent {agent}: {exc!r}")
