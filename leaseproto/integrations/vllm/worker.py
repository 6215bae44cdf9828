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
step after it completes (vLLM drops it until the next interval).
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

from leaseproto import LateTransfer, LeaseConfig, Release, ReleaseReason, wire

from .amx import request_amx_tiles
from .config import lease_config_from_extra_config
from .leases import LeaseView, WorkerLeases
from .scheduler import VERIFY_ATTR
from .stats import LeaseprotoKVConnectorStats
from .verify import ReadVerifier, decode_hello, encode_hello

__all__ = ["LeaseprotoConnectorWorker"]

logger = logging.getLogger("vllm.leaseproto.worker")


def _config_of(obj: object) -> LeaseConfig:
    kv = getattr(getattr(obj, "vllm_config", None), "kv_transfer_config", None)
    return lease_config_from_extra_config(getattr(kv, "kv_connector_extra_config", None))


def _on_cpu(vllm_config: Any) -> bool:
    return getattr(getattr(vllm_config, "device_config", None), "device_type", None) == "cpu"


class LeaseprotoConnectorWorker(NixlPullConnectorWorker):  # type: ignore[misc]
    """vLLM's pull worker with the lease core as the one record of leases."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        self.vllm_config = vllm_config
        config = _config_of(self)  # refuses a bad config before NIXL starts
        if _on_cpu(vllm_config):
            request_amx_tiles()  # before any forward: vLLM's AMX attention needs them
        self._lp = WorkerLeases(config)
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._lp.config = self._lp.table.config = config  # vLLM's __init__ set its own extension
        self.xfer_stats = LeaseprotoKVConnectorStats()

    # -- state (also reachable on workers built with object.__new__, as vLLM's tests do) ---
    def _leases(self) -> WorkerLeases:
        lp: WorkerLeases | None = self.__dict__.get("_lp")
        if lp is None:
            lp = self.__dict__["_lp"] = WorkerLeases(_config_of(self))
        return lp

    def _verifier(self) -> ReadVerifier:
        v: ReadVerifier | None = self.__dict__.get("_lp_verifier")
        if v is None:
            v = self.__dict__["_lp_verifier"] = ReadVerifier(self._leases().config.lease_extension)
        return v

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

    # -- P: notifications -------------------------------------------------------------------
    def _get_new_notifs(self) -> set[str]:
        done: set[str] = set()
        for agent, notifs in self.nixl_wrapper.get_new_notifs().items():
            for raw in notifs:
                self._on_notification(agent, raw, done)
        return done

    def _on_notification(self, agent: str, raw: bytes, done: set[str]) -> None:
        hello = decode_hello(raw)
        if hello is not None:
            self._on_hello(agent, hello)
            return
        try:
            msg = wire.decode(raw)
        except wire.MalformedMessage as exc:
            self._stat("lp_malformed")
            logger.warning("Dropped a malformed notification from %s: %s", agent, exc)
            return
        if isinstance(msg, wire.Heartbeat):
            self._renew(msg.ids, agent)
        elif isinstance(msg, wire.TransferDone):
            self._transfer_done(msg.req_id, msg.count, done, agent)
        elif isinstance(msg, (wire.Ok, wire.Nack, wire.LeaseLost)):
            self._verifier().on_message(msg)
        elif isinstance(msg, wire.Abort):
            release = self._leases().table.abort(msg.req_id, now=self._leases().now())
            if release is not None:
                self._stat("lp_aborted")
                self._released(release, done)
        else:
            self._stat("lp_malformed")
            logger.warning("Dropped a %s from %s: not a message for P", type(msg).__name__, agent)

    def _handle_heartbeat(self, payload: str) -> None:
        try:
            msg = wire.decode(b"HB:" + payload.encode("utf-8", "surrogateescape"))
        except wire.MalformedMessage as exc:
            self._stat("lp_malformed")
            logger.warning("Dropped a malformed heartbeat: %s", exc)
            return
        assert isinstance(msg, wire.Heartbeat)
        self._renew(msg.ids)

    def _renew(self, ids: tuple[str, ...], agent: str | None = None) -> None:
        lp = self._leases()
        before = lp.table.stats
        lost: list[str] = []
        now = lp.now()
        renewed = lp.table.renew(ids, now=now, lost=lost)
        if agent is not None and agent in self._lp_set("_lp_capable"):
            for rid in lost:  # advisory: D may give up early; a verdict still decides
                self._answer(agent, wire.lease_lost(rid, lp.table.lost_reason(rid, now=now)))
        after = lp.table.stats
        self._stat("lp_leases_renewed", renewed)
        self._stat("lp_heartbeat_ids_unknown", after.renew_unknown - before.renew_unknown)
        self._stat("lp_heartbeat_ids_late", len(lost))

    def _transfer_done(
        self, req_id: str, readers: int, done: set[str], agent: str | None = None
    ) -> None:
        lp = self._leases()
        table = lp.table
        known = (
            req_id in table
            or table.ended(req_id) is not None
            or req_id in getattr(self, "_reqs_to_process", ())
        )
        result = lp.transfer_done(req_id, readers) if known else None
        if agent is not None and agent in self._lp_set("_lp_capable"):
            if known and result is None:  # early: staged, answered when the grant settles it
                self.__dict__.setdefault("_lp_early", {}).setdefault(req_id, []).append(agent)
            else:
                self._answer(agent, wire.verdict(req_id, result))
        if not known:
            self._unrecognized(req_id, None)
        elif isinstance(result, Release):
            self._released(result, done)
        elif isinstance(result, LateTransfer):
            self._stat("lp_late_reads")
            self._unrecognized(req_id, result.ended)

    def _unrecognized(self, req_id: str, ended: ReleaseReason | None) -> None:
        self.xfer_stats.record_notification_after_expiry()
        how = "unrecognized" if ended is None else f"{ended.value}"
        logger.error(
            "Potentially invalid KV blocks for %s request %s were retrieved by a "
            "decode worker after its lease ended.",
            how,
            req_id,
        )

    def _released(self, release: Release, done: set[str]) -> None:
        getattr(self, "_reqs_to_process", set()).discard(release.req_id)
        self.consumer_notification_counts_by_req.pop(release.req_id, None)
        self.expected_consumer_notifications_by_req.pop(release.req_id, None)
        done.add(release.req_id)

    def _answer(self, agent: str, msg: wire.Message) -> None:
        try:
            for payload in wire.encode(msg):
                self.nixl_wrapper.send_notif(agent, notif_msg=payload)
            self._stat("lp_verdicts_sent" if not isinstance(msg, wire.LeaseLost) else "lp_ll_sent")
        except Exception:
            self._stat("lp_verdict_send_failures")
            logger.warning("Could not send %s to %s", type(msg).__name__, agent, exc_info=True)

    def _on_hello(self, agent: str, metadata: bytes) -> None:
        try:
            name = self.nixl_wrapper.add_remote_agent(metadata)
        except Exception as exc:
            self._stat("lp_malformed")
            logger.warning("Dropped a leaseproto hello from %s: %s", agent, exc)
            return
        self._lp_set("_lp_capable").update((agent, str(name)))
        logger.info(
            "Decode agent %s understands %s: verdicts will be sent to it", agent, wire.CAPABILITY
        )

    # -- P: expiry --------------------------------------------------------------------------
    def _reap_expired_send_leases(self, done_sending: set[str]) -> None:
        lp = self._leases()
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

    # -- D: heartbeats ----------------------------------------------------------------------
    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        deferred = self._deferred()
        due = {**deferred, **metadata.heartbeat_by_engine}
        deferred.clear()
        max_bytes = self._leases().config.max_notification_bytes
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
            payloads = self._encode_heartbeat(info.req_ids, max_bytes)
            for agent_name in self._remote_agents[engine_id].values():
                for payload in payloads:
                    try:
                        self.nixl_wrapper.send_notif(agent_name, notif_msg=payload)
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
        super().start_load_kv(metadata)

    def _read_blocks_for_req(self, req_id: str, meta: Any) -> None:
        remote = meta.remote
        if remote is not None and any(meta.local_block_ids):
            engine = remote.engine_id
            if req_id in self._lp_set("_lp_advertised"):
                self._verifier().expect(req_id, remote.request_id)
                self._hello(engine)
            elif engine not in self._lp_set("_lp_unverified_logged"):
                self._lp_set("_lp_unverified_logged").add(engine)
                logger.warning(
                    "Prefill engine %s does not advertise %s: its KV is used unverified, as "
                    "with stock vLLM",
                    engine,
                    wire.CAPABILITY,
                )
        super()._read_blocks_for_req(req_id, meta)

    def _hello(self, engine: str) -> None:
        """Tell an advertised P, once per agent, that we understand its verdicts."""
        greeted = self._lp_set("_lp_greeted")
        agents = getattr(self, "_remote_agents", {}).get(engine, {})
        for agent in agents.values():
            if agent in greeted:
                continue
            try:
                self.nixl_wrapper.send_notif(
                    agent, notif_msg=encode_hello(self.nixl_wrapper.get_agent_metadata())
                )
                greeted.add(agent)
            except Exception:
                logger.warning("Could not greet prefill agent %s", agent, exc_info=True)

    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        done, failed = super()._pop_done_transfers(transfers)
        verifier = self._verifier()
        before = (verifier.stats.refused, verifier.stats.timed_out, verifier.stats.verified)
        done, failed = verifier.settle(done, failed, now=self._leases().now())
        after = (verifier.stats.refused, verifier.stats.timed_out, verifier.stats.verified)
        self._stat("lp_reads_refused", after[0] - before[0])
        self._stat("lp_reads_verdict_timeout", after[1] - before[1])
        self._stat("lp_reads_verified", after[2] - before[2])
        return done, failed
