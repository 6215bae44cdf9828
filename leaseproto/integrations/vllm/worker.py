"""The worker side of :class:`~leaseproto.integrations.vllm.LeaseprotoConnector`.

P: :class:`~leaseproto.LeaseTable` (through :class:`WorkerLeases`) is the one
record of leases. vLLM's ``_reqs_to_send`` is a view of it, so vLLM's own
``start_load_kv`` grants (with the scheduler's deadline rebased onto the worker
clock, as vLLM does), heartbeats renew through the core's rule, transfer-dones
count readers from vLLM's ``n``, the core's expiry feeds ``done_sending`` and
``vllm:nixl_num_kv_expired_reqs``, and a transfer-done after the lease ended is
the core's :class:`~leaseproto.LateTransfer`.

D: heartbeats the scheduler found due are split at ``max_notification_bytes``;
one whose engine's handshake is still pending is held and sent on the first
step after it completes (vLLM drops it until the next interval). Each READ
vLLM posts to an advertised P rank (:meth:`_read_blocks`, once per rank read)
is expected by the :class:`~.verify.ReadVerifier`, which reports it only after
``OK:`` from every one of those agents.

What each notification does (both sides) is in :mod:`.notifications`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    HeartbeatInfo,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)

from leaseproto import LeaseConfig, wire
from leaseproto.core.mac import FRAME_OVERHEAD, ClusterKey
from leaseproto.core.mac_peers import PeerAuth

from .amx import request_amx_tiles
from .config import lease_config_from_extra_config
from .leases import LeaseView, WorkerLeases
from .notifications import NotificationHandling
from .scheduler import AUTH_ATTR, ENGINE_AUTH_ATTR, VERIFY_ATTR
from .sealing import SealedNixl, announce, key_problem, load_key
from .stats import LeaseprotoKVConnectorStats
from .trace import TracedNixl, open_connector_trace
from .verify import ReadVerifier, agent_name, encode_hello

__all__ = ["LeaseprotoConnectorWorker"]

logger = logging.getLogger("vllm.leaseproto.worker")


def _extra_of(obj: object) -> Any:
    kv = getattr(getattr(obj, "vllm_config", None), "kv_transfer_config", None)
    return getattr(kv, "kv_connector_extra_config", None)


def _config_of(obj: object) -> LeaseConfig:
    return lease_config_from_extra_config(_extra_of(obj))


def _on_cpu(vllm_config: Any) -> bool:
    return getattr(getattr(vllm_config, "device_config", None), "device_type", None) == "cpu"


class LeaseprotoConnectorWorker(NotificationHandling, NixlPullConnectorWorker):  # type: ignore[misc]
    """vLLM's pull worker with the lease core as the one record of leases."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        self.vllm_config = vllm_config
        config = _config_of(self)  # refuses a bad config before NIXL starts
        if _on_cpu(vllm_config):
            request_amx_tiles()  # before any forward: vLLM's AMX attention needs them
        key = self._cluster_key()  # a bad key file, too, is refused before NIXL starts
        least = wire.MAX_ID_BYTES + wire.VERDICT_OVERHEAD + FRAME_OVERHEAD
        if key is not None and config.max_notification_bytes < least:
            raise ValueError(
                f"with a cluster_key_file, max_notification_bytes must be at least {least} "
                f"(the longest verdict plus the {FRAME_OVERHEAD}-byte frame), got "
                f"{config.max_notification_bytes}"
            )
        announce(f"LeaseprotoConnector worker (engine {engine_id})", key)
        self._lp = WorkerLeases(config)
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._lp.config = self._lp.table.config = config  # vLLM's __init__ set its own extension
        self.xfer_stats = LeaseprotoKVConnectorStats()
        role = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_role", None)
        self._lp.grant_kind = "turn" if role == "kv_consumer" else "prefill"  # D: turn 1's blocks
        self._lp.trace = open_connector_trace(
            _extra_of(self),
            producer=role != "kv_consumer",
            engine=engine_id,
            rank=int(getattr(self, "tp_rank", 0)),
            tp=int(getattr(self, "world_size", 1)),
            agent=agent_name(getattr(self.__dict__.get("_lp_nixl"), "name", "")),
            config=config,
        )

    # -- state (also reachable on workers built with object.__new__, as vLLM's tests do) ---
    def _leases(self) -> WorkerLeases:
        lp: WorkerLeases | None = self.__dict__.get("_lp")
        if lp is None:
            lp = self.__dict__["_lp"] = WorkerLeases(_config_of(self))
        return lp

    def _verifier(self) -> ReadVerifier:
        v: ReadVerifier | None = self.__dict__.get("_lp_verifier")
        if v is None:
            cfg = self._leases().config
            stale = max(10 * cfg.kv_lease_duration, cfg.max_lease_lifetime or 0.0)
            v = self.__dict__["_lp_verifier"] = ReadVerifier(cfg.lease_extension, stale)
        return v

    def _cluster_key(self) -> ClusterKey | None:
        if "_lp_key" not in self.__dict__:
            self.__dict__["_lp_key"] = load_key(_extra_of(self))
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
            readers = lp.readers_done(release.req_id)
            self.xfer_stats.record_kv_expired_req()
            logger.warning(
                "Releasing expired KV blocks for request %s which were retrieved "
                "by %d remote worker(s) before lease expired.",
                release.req_id,
                readers,
            )
            self._released(release, done_sending)
        now = lp.now()
        if now - self.__dict__.get("_lp_pruned", -1.0e18) >= 1.0:
            self.__dict__["_lp_pruned"] = now
            self._prune_bindings()
            self._forget_silent_decoders()

    # -- D: heartbeats ----------------------------------------------------------------------
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
                for payload in payloads:
                    try:
                        self.nixl_wrapper.send_notif(agent, notif_msg=payload)
                        self._sent_to(agent)
                        self._stat("lp_heartbeats_sent")
                    except Exception:
                        self._stat("lp_heartbeat_send_failures")
                        logger.debug(
                            "Failed to send heartbeat to engine %s", engine_id, exc_info=True
                        )

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

    # -- D: verified reads (I13) ------------------------------------------------------------
    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        self._lp_set("_lp_advertised").update(getattr(metadata, VERIFY_ATTR, ()))
        self._key_ids().update(getattr(metadata, AUTH_ATTR, {}))
        super().start_load_kv(metadata)

    def _key_ids(self) -> dict[str, str | None]:
        """Advertised request -> the key id its P advertised (None: no key)."""
        out: dict[str, str | None] = self.__dict__.setdefault("_lp_key_ids", {})
        return out

    def _read_blocks_for_req(self, req_id: str, meta: Any) -> None:
        remote = meta.remote
        if (
            remote is not None
            and any(meta.local_block_ids)
            and req_id not in self._lp_set("_lp_advertised")
            and remote.engine_id not in self._lp_set("_lp_unverified_logged")
        ):
            self._lp_set("_lp_unverified_logged").add(remote.engine_id)
            logger.warning(
                "Engine %s (read from) does not advertise %s: its KV is used unverified, "
                "as with stock vLLM",
                remote.engine_id,
                wire.CAPABILITY,
            )
        if remote is not None and req_id in self._lp_set("_lp_advertised"):
            problem = key_problem(
                remote.engine_id, self._key_ids().get(req_id), self._cluster_key()
            )
            if problem is not None:  # refused: vLLM's failure path (recompute), nothing read
                self._stat("lp_key_mismatch")
                self._drops().drop("read of a prefill engine with another cluster key", problem)
                self._used_advert(req_id)
                self._handle_failed_transfer(
                    req_id, None, self._recv_failures, record_failed_transfer=False
                )
                return
        # handshake pending: vLLM calls us again once it is done, without the metadata
        pending = remote is None or remote.engine_id not in getattr(self, "_remote_agents", {})
        super()._read_blocks_for_req(req_id, meta)
        if not pending:  # posted or failed: the advertisement has been used
            self._used_advert(req_id)

    def _used_advert(self, req_id: str) -> None:
        self._lp_set("_lp_advertised").discard(req_id)
        self._key_ids().pop(req_id, None)

    def _read_blocks(self, read_spec: Any, dst_engine_id: str, **kw: Any) -> bool:
        """One READ from one P rank: vLLM calls this for each rank it reads
        (:func:`compute_tp_mapping`'s source ranks), so the verifier expects a
        verdict from exactly the agents read, whatever the TP ratio."""
        req_id = kw["request_id"]
        raw = self._remote_agents.get(dst_engine_id, {}).get((0, read_spec.remote_rank))
        agent = None if raw is None else agent_name(raw)  # as P's verdicts will name it
        reads = any(len(g) > 0 for g in read_spec.local_block_ids)
        if agent is not None and reads and req_id in self._lp_set("_lp_advertised"):
            self._hello_agent(agent)
            self._verifier().expect(
                req_id, kw["remote_request_id"], agent, now=self._leases().now()
            )
        if agent is not None:
            self._sent_to(agent)  # the transfer-done goes with the READ
        wrapper = self._sealed_wrapper()
        traced = self.nixl_wrapper if isinstance(self.nixl_wrapper, TracedNixl) else None
        if wrapper is not None and agent is not None:
            wrapper.reading = (agent, req_id)  # the READ's transfer-done is sealed for it
        if traced is not None:
            traced.read_to = agent  # the READ's transfer-done is a trace's read event
        try:
            posted: bool = super()._read_blocks(
                read_spec=read_spec, dst_engine_id=dst_engine_id, **kw
            )
        finally:
            if wrapper is not None:
                wrapper.reading = None
            if traced is not None:
                traced.read_to = None
        if not posted:  # vLLM routed the request to failure reporting
            self._verifier().forget(req_id)
        return posted

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

    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        done, failed = super()._pop_done_transfers(transfers)
        verifier = self._verifier()
        before = (verifier.stats.refused, verifier.stats.timed_out, verifier.stats.verified)
        done, failed = verifier.settle(done, failed, now=self._leases().now())
        for settled in verifier.take_settled():
            self._read_settled(settled)
        for agent in verifier.take_silent():  # P may have forgotten us: greet again
            self._greeted().pop(agent, None)
        after = (verifier.stats.refused, verifier.stats.timed_out, verifier.stats.verified)
        self._stat("lp_reads_refused", after[0] - before[0])
        self._stat("lp_reads_verdict_timeout", after[1] - before[1])
        if after[:2] != before[:2]:  # a peer's NK or silence: rate-limited
            self._drops().drop(
                "read not verified, failed (recomputed under kv_load_failure_policy)",
                f"{after[0] - before[0]} refused, {after[1] - before[1]} without a verdict",
            )
        self._stat("lp_reads_verified", after[2] - before[2])
        return done, failed
