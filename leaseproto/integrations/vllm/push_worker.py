"""The worker side of :class:`~leaseproto.integrations.vllm.LeaseprotoPushConnector`.

vLLM's push worker (its ``nixl-push-writer`` thread sends registrations,
matches them and posts the WRITEs) with the lease of :mod:`.push`:

- D: each registration, once vLLM's writer sent it, is a lease in the
  worker's table (kind ``push``), renewed by P's ``HB:``, and an entry of the
  core's :class:`~leaseproto.core.push.PushRegistrations` naming its writers;
  the WRITE's notification is a transfer-done for it; the receive is reported
  done only once every writer's completion was handled while the lease was
  live (I15), failed otherwise, and a lapsed registration's blocks are held
  until every writer completed, aborted or was forgotten (:mod:`.push_decoder`).
- P: its own leases as in pull mode (heartbeats naming D's id or the router's
  base id renew them: B2), ended TRANSFERRED when its WRITE completes; a lease
  that expires while its WRITE is still running keeps its blocks until the
  WRITE is over (the WRITE reads them). P heartbeats advertising decoders for
  their registrations and aborts the ones it will not write (B9), through
  :class:`~.push.PushWrites`.

vLLM's writer thread owns ``get_new_notifs``: :class:`~.push.PushRouter` hands
it the registrations and queues everything else, with its sender, for the
main thread (vLLM drops the sender), and, behind each registration D sends,
the agents it went to. What each notification does is in
:mod:`.push_notifications`.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

import msgspec
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    PUSH_REG_NOTIF_PREFIX,
    HeartbeatInfo,
    NixlConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

from leaseproto import HeartbeatTracker, LocalProtocolError, wire

from .push import Inbound, PushRouter, PushWrites, SentRegistration, registration_ttl
from .push_notifications import PushNotifications
from .push_scheduler import ABORTED_ATTR, ALIVE_ATTR
from .trace import TracedNixl
from .verify import agent_name
from .worker_base import LeaseWorker, extra_of

__all__ = ["LeaseprotoPushConnectorWorker"]

logger = logging.getLogger("vllm.leaseproto.worker")


class LeaseprotoPushConnectorWorker(PushNotifications, LeaseWorker, NixlPushConnectorWorker):  # type: ignore[misc]
    """vLLM's push worker with the lease core on both sides (see the module's docstring)."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        config = self._lp_before_init(vllm_config, engine_id, "LeaseprotoPushConnector")
        if self._cluster_key() is not None:
            raise ValueError(
                "cluster_key_file: LeaseprotoPushConnector does not seal its messages yet (a "
                "decoder's registration is its first message to P, sent before it can know "
                "whether P holds the key); run push mode without a key, or pull mode with one"
            )
        super().__init__(vllm_config, engine_id, kv_cache_config)
        role = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_role", None)
        extra = extra_of(self) or {}
        ttl = extra.get("push_registration_timeout", extra.get("decoder_kv_blocks_ttl", 480))
        self._lp_after_init(
            vllm_config,
            engine_id,
            config,
            grant_kind="prefill",  # P's; D's registrations are granted as kind push
            producer=role != "kv_consumer",
            trace_config={"push_registration_timeout": float(ttl)},
        )
        self.__dict__["_lp_route"] = True  # the writer's polls go through our router
        self._writes()  # built here, not by whichever thread asks first
        _ = self.nixl_wrapper

    # -- state (also on workers built with object.__new__, as vLLM's tests do) ------------------
    def _writes(self) -> PushWrites:
        w: PushWrites | None = self.__dict__.get("_lp_writes")
        if w is None:
            w = self.__dict__["_lp_writes"] = PushWrites(self._leases().config.lease_extension)
        return w

    def _push_tracker(self) -> HeartbeatTracker:
        t: HeartbeatTracker | None = self.__dict__.get("_lp_push_tracker")
        if t is None:
            t = self.__dict__["_lp_push_tracker"] = HeartbeatTracker(self._leases().config)
        return t

    def _inbox(self) -> queue.Queue[Inbound]:
        q: queue.Queue[Inbound] | None = self.__dict__.get("_lp_inbox")
        if q is None:
            q = self.__dict__["_lp_inbox"] = queue.Queue()
        return q

    def _wrap_inner(self, wrapper: Any) -> Any:
        if not self.__dict__.get("_lp_route"):
            return wrapper  # vLLM's tests build workers without __init__: vLLM's plumbing
        router: PushRouter | None = self.__dict__.get("_lp_router")
        if router is None or router.inner is not wrapper:
            router = self.__dict__["_lp_router"] = PushRouter(
                wrapper, self._inbox(), self._reg_sent_to
            )
        return router

    # -- the writer thread -------------------------------------------------------------------
    def _handle_push_reg_notif(self, notif: bytes) -> None:
        """P: a registration arrived; one that advertised is renewed and may be aborted."""
        try:
            reg = msgspec.msgpack.decode(bytes(notif)[len(PUSH_REG_NOTIF_PREFIX) :])
        except Exception:
            reg = None
        if isinstance(reg, dict):
            self._writes().arrived(reg, now=time.perf_counter())
        super()._handle_push_reg_notif(notif)

    def _do_send_reg_notif(self, req_id: str, reg_data: dict[str, Any]) -> None:
        """D: vLLM sends the registration to P's agents; the main thread learns
        which (its writers), ahead of anything they answer (one queue)."""
        sends: list[tuple[str, bool]] = []
        self.__dict__["_lp_reg_sends"] = sends
        try:
            super()._do_send_reg_notif(req_id, reg_data)
        finally:
            self.__dict__.pop("_lp_reg_sends", None)
        if sends:  # none: our router is off (vLLM's tests), or vLLM had no agent
            writers = tuple(a for a, _ in sends)
            unsent = tuple(a for a, ok in sends if not ok)
            self._inbox().put(SentRegistration(req_id, dict(reg_data), writers, unsent))

    def _do_start_push_kv(self, request_id: str, local_block_ids: Any, reg: dict[str, Any]) -> None:
        d_id = reg.get("request_id")
        if (
            isinstance(d_id, str)
            and registration_ttl(reg) is not None
            and not self._writes().may_write(d_id, request_id)
        ):
            logger.info("Not writing %s into %s: the registration was given up", request_id, d_id)
            return
        super()._do_start_push_kv(request_id, local_block_ids, reg)

    def _xfer_blocks(self, *args: Any, **kw: Any) -> Any:
        """One WRITE to one D rank: traced as a ``write`` with its completion."""
        traced = self.nixl_wrapper
        if not isinstance(traced, TracedNixl):
            return super()._xfer_blocks(*args, **kw)
        spec, engine = kw.get("read_spec"), str(kw.get("dst_engine_id"))
        raw = self._remote_agents.get(engine, {}).get((0, getattr(spec, "remote_rank", 0)))
        traced.read_to, traced.xfer_ev = (None if raw is None else agent_name(raw)), "write"
        try:
            return super()._xfer_blocks(*args, **kw)
        finally:
            traced.read_to, traced.xfer_ev = None, "read"

    # -- the main thread: each step ------------------------------------------------------------
    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        self._writes().set_alive(getattr(metadata, ALIVE_ATTR, {}))
        super().start_load_kv(metadata)
        if self.pcp_rank > 0 and not self.pcp_dcp_sharded:
            return  # vLLM sends nothing from this rank
        for d_id in getattr(metadata, ABORTED_ATTR, ()):
            self._aborted_here(d_id)

    def _get_new_notifs(self) -> set[str]:
        done: set[str] = set()
        self._p_step()
        inbox = self.__dict__.get("_lp_inbox")
        trace = self._leases().trace
        while inbox is not None:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, SentRegistration):
                self._grant_registration(item)
                continue
            agent, raw = item
            if trace.enabled:
                trace.emit("recv", src=agent, data=raw.decode("latin-1"))
            self._on_notification(agent, raw, done)
        forwarded = self.__dict__.get("_pending_completion_notifs")
        if forwarded is not None and not forwarded.empty():
            # what vLLM's writer forwarded without its sender (where our router is off,
            # vLLM's tests) or what we handed to vLLM's counting: never a registration of
            # ours (those exist only once sent through our router)
            theirs: set[str] = NixlPushConnectorWorker._get_new_notifs(self)  # not pull's
            done |= theirs
        self._push_step()
        return done

    def _send_heartbeats(self, metadata: NixlConnectorMetadata) -> None:
        """Ours to the grantors we renew: D's to P (the scheduler's), and P's to D."""
        tracker = self._push_tracker()
        due = tracker.due(now=self._leases().now()) if len(tracker) else {}
        if due:
            held = self._writes().held
            infos = {}
            for engine, ids in due.items():
                regs = [held[i] for i in ids if i in held]
                if not regs:
                    continue
                reg = regs[0]
                infos[engine] = HeartbeatInfo(
                    req_ids=set(ids), host=reg.host, port=reg.port, tp_size=reg.tp
                )
            metadata.heartbeat_by_engine = {**metadata.heartbeat_by_engine, **infos}
        super()._send_heartbeats(metadata)

    def _before_heartbeat(self, engine: str, agent: str | bytes) -> None:
        """P: until D answered it, each heartbeat to a D agent is preceded by our
        capability (``HB:leaseproto/1``): D sends ``LL:`` and holds lapsed
        registrations only for a P that said it."""
        if engine not in self._push_tracker().engines():
            return
        name = agent_name(agent)
        if name in self.__dict__.setdefault("_lp_acked", set()):
            return
        try:
            self.nixl_wrapper.send_notif(
                agent, notif_msg=wire.encode_heartbeat([wire.CAPABILITY])[0]
            )
        except Exception as exc:
            self._drops().drop("unsent capability", f"to decode agent {name}: {exc!r}")

    # -- P -----------------------------------------------------------------------------------
    def _p_step(self) -> None:
        """P: take new registrations; renew the ones whose request P holds; give
        up the others (an ``AB:`` to D once nothing of them is in flight)."""
        writes = self._writes()
        writes.take_arrived()
        tracker = self._push_tracker()
        now = self._leases().now()
        renew, give_up = writes.step(now=now)
        for reg in renew:
            if reg.d_id not in tracker:
                try:
                    tracker.track(reg.d_id, engine_id=reg.engine, remote_req_id=reg.d_id, now=now)
                except LocalProtocolError as exc:
                    logger.error("Not heartbeating registration %s: %s", reg.d_id, exc)
        for reg in give_up:
            if writes.cancel(reg.d_id) is not None:
                self._abort_to_d(reg.d_id, reg.engine, reg.host, reg.port, reg.tp)
            tracker.untrack(reg.d_id)
        self._send_pending_aborts()

    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        """P: a request whose WRITEs are all over ended its lease TRANSFERRED (or,
        if one failed, tells D with ``AB:``)."""
        earlier = set(self.__dict__.get("_send_failures", ()))
        done, failed = super()._pop_done_transfers(transfers)
        if transfers is self.__dict__.get("_sending_transfers"):
            for p_id in done:
                self._write_over(p_id, ok=p_id not in failed and p_id not in earlier)
        return done, failed

    def _write_over(self, p_id: str, *, ok: bool) -> None:
        tracker = self._push_tracker()
        for reg in self._writes().written(p_id):
            tracker.untrack(reg.d_id)
            if not ok:
                self._abort_to_d(reg.d_id, reg.engine, reg.host, reg.port, reg.tp)
        lp = self._leases()
        if ok and p_id in lp.table:
            now = lp.now()
            lp.trace.emit("written", now=now, req=p_id)
            lp.transfer_done(p_id, 1, now=now)  # vLLM reports it done_sending itself
            self._stat("lp_push_writes_done")

    def _expired(self, release: Any, done_sending: set[str]) -> None:
        """D: a registration lapsed. P: a lease that expires while its WRITE
        still reads the blocks keeps them until the WRITE is over (vLLM frees
        them at once)."""
        if release.req_id in self._registered():
            self._registration_ended(release)
            return
        if release.req_id in self.__dict__.get("_sending_transfers", {}):
            self.__dict__.setdefault("_lp_parked", set()).add(release.req_id)
            self.xfer_stats.record_kv_expired_req()
            logger.warning(
                "Lease of request %s expired while its WRITE is running: its blocks are "
                "freed when the WRITE is over",
                release.req_id,
            )
            return
        super()._expired(release, done_sending)

    def get_transfer_results(self) -> Any:
        results = super().get_transfer_results()
        parked: set[str] = self.__dict__.get("_lp_parked", set())
        for p_id in [p for p in parked if p not in self._sending_transfers]:
            parked.discard(p_id)
            self._reqs_to_process.discard(p_id)
            results.finished_sending.add(p_id)
            self._evict_finished_inbox.put(p_id)
        return results
