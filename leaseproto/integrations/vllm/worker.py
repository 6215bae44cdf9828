"""The worker side of :class:`~leaseproto.integrations.vllm.LeaseprotoConnector` (pull mode).

P: :class:`~leaseproto.LeaseTable` (through :class:`~.leases.WorkerLeases`) is
the one record of leases. vLLM's ``_reqs_to_send`` is a view of it, so vLLM's
own ``start_load_kv`` grants (with the scheduler's deadline rebased onto the
worker clock, as vLLM does), heartbeats renew through the core's rule,
transfer-dones count readers from vLLM's ``n``, the core's expiry feeds
``done_sending`` and ``vllm:nixl_num_kv_expired_reqs``, and a transfer-done
after the lease ended is the core's :class:`~leaseproto.LateTransfer`.

D: heartbeats as :class:`~.worker_base.LeaseWorker` sends them. Each READ vLLM
posts to an advertised P rank (:meth:`_read_blocks`, once per rank read) is
expected by the :class:`~.verify.ReadVerifier`, which reports it only after
``OK:`` from every one of those agents. In the step that sees READs complete,
D waits up to ``verdict_wait`` for their verdicts (:class:`~.verify.VerdictWaits`),
so that with P answering promptly the READ is reported in that step, as stock
vLLM reports it, and the verdict costs no extra engine step.

Both: an engine step with nothing to compute, while this engine holds leases and
reads nothing, polls NIXL's notifications for up to ``idle_wait`` instead of
returning at once (:mod:`.idle`): P answers a transfer-done as it arrives,
not when its next engine step comes round.

What each notification does (both sides) is in :mod:`.notifications`; what
the push worker shares with this one, in :mod:`.worker_base`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)

from leaseproto import wire

from .idle import IDLE_ATTR, idle_wait, poll_until
from .notifications import NotificationHandling
from .sealing import key_problem
from .trace import TracedNixl
from .tracking import AUTH_ATTR, VERIFY_ATTR
from .verify import ReadVerifier, VerdictWaits, agent_name, verdict_wait
from .worker_base import LeaseWorker, extra_of

__all__ = ["LeaseprotoConnectorWorker"]

logger = logging.getLogger("vllm.leaseproto.worker")

#: How often a step that waits for verdicts polls NIXL's notifications (seconds);
#: it sleeps in between, leaving the CPU to P (which may share it).
VERDICT_POLL_S = 0.0002


class LeaseprotoConnectorWorker(NotificationHandling, LeaseWorker, NixlPullConnectorWorker):  # type: ignore[misc]
    """vLLM's pull worker with the lease core as the one record of leases."""

    def __init__(self, vllm_config: Any, engine_id: str, kv_cache_config: Any) -> None:
        config = self._lp_before_init(vllm_config, engine_id, "LeaseprotoConnector")
        self._verdict_waits()  # a bad verdict_wait stops the engine before NIXL starts
        self._idle_wait_s()  # and a bad idle_wait
        super().__init__(vllm_config, engine_id, kv_cache_config)
        role = getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_role", None)
        self._lp_after_init(
            vllm_config,
            engine_id,
            config,
            grant_kind="turn" if role == "kv_consumer" else "prefill",  # D: turn 1's blocks
            producer=role != "kv_consumer",
        )

    def _verifier(self) -> ReadVerifier:
        v: ReadVerifier | None = self.__dict__.get("_lp_verifier")
        if v is None:
            cfg = self._leases().config
            stale = max(10 * cfg.kv_lease_duration, cfg.max_lease_lifetime or 0.0)
            v = self.__dict__["_lp_verifier"] = ReadVerifier(cfg.lease_extension, stale)
        return v

    def _verdict_waits(self) -> VerdictWaits:
        w: VerdictWaits | None = self.__dict__.get("_lp_waits")
        if w is None:
            cfg = self._leases().config
            wait = verdict_wait(extra_of(self), cfg.lease_extension)
            w = self.__dict__["_lp_waits"] = VerdictWaits(wait, cfg.heartbeat_interval)
        return w

    def _idle_wait_s(self) -> float:
        w: float | None = self.__dict__.get("_lp_idle_wait")
        if w is None:
            bound = self._leases().config.heartbeat_interval
            w = self.__dict__["_lp_idle_wait"] = idle_wait(extra_of(self), bound)
        return w

    # -- an engine step with nothing to compute ----------------------------------------------
    def get_transfer_results(self) -> Any:
        if self.__dict__.pop("_lp_idle_step", False):
            self._wait_while_idle()
        return super().get_transfer_results()

    def _wait_while_idle(self) -> None:
        """Poll notifications for up to ``idle_wait``, in a step that computes nothing,
        while this engine holds leases and has no READ of its own in flight; until a
        poll finds a request done sending or the earliest lease deadline comes. What
        the polls find is reported by this step (:meth:`_get_new_notifs` returns it
        first); a poll that fails ends the wait and loses nothing."""
        wait = self._idle_wait_s()
        lp = self._leases()
        if (
            wait <= 0
            or not len(lp.table)
            or self._recving_metadata
            or self._recving_transfers
            or lp.settled
            or lp.refused
            or self.__dict__.get("_lp_done_carry")  # news already: report it now
        ):
            return
        now = lp.now()
        first = lp.table.next_deadline()
        until = now + wait if first is None else min(now + wait, first)
        self._stat("lp_idle_waits")

        def poll() -> bool:
            try:
                done = self.__dict__["_lp_done_carry"] = self._get_new_notifs()
            except Exception as exc:  # what earlier polls carried stays for the step's poll
                self._drops().drop("notification poll failed during an idle wait", repr(exc))
                return True
            return bool(done) or bool(lp.settled) or bool(lp.refused)

        poll_until(poll, lp.now, until)

    # -- D: verified reads (I13) ------------------------------------------------------------
    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        self.__dict__["_lp_idle_step"] = bool(getattr(metadata, IDLE_ATTR, False))
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

    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> tuple[set[str], set[str]]:
        done, failed = super()._pop_done_transfers(transfers)
        verifier = self._verifier()
        before = (verifier.stats.refused, verifier.stats.timed_out, verifier.stats.verified)
        finished = done - failed
        done, failed = verifier.settle(done, failed, now=self._leases().now())
        held = finished - done  # READs that completed now and wait for verdicts
        if held:
            more_done, more_failed = self._await_verdicts(held)
            done |= more_done
            failed |= more_failed
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

    def _await_verdicts(self, held: set[str]) -> tuple[set[str], set[str]]:
        """Poll for the verdicts of ``held`` (READs this step saw complete) for up
        to ``verdict_wait``; returns what :meth:`ReadVerifier.settle` then reports.

        Each poll handles every notification, as the step's own poll does; the
        requests it finds done sending (this engine as a grantor) are reported
        by the next step's poll (:meth:`_get_new_notifs` returns them first)."""
        verifier, waits, lp = self._verifier(), self._verdict_waits(), self._leases()
        asked = verifier.awaiting(held)
        if not asked or not waits.worth(asked, now=lp.now()):
            return set(), set()
        self._stat("lp_verdict_waits")
        end = time.monotonic() + waits.wait
        while True:
            try:
                self.__dict__["_lp_done_carry"] = self._get_new_notifs()
            except Exception as exc:  # the READs this step popped must still be reported
                self._drops().drop("notification poll failed during a verdict wait", repr(exc))
                missing = verifier.awaiting(held)
                break
            missing = verifier.awaiting(held)
            if not missing or time.monotonic() >= end:
                break
            time.sleep(VERDICT_POLL_S)
        now = lp.now()
        waits.ended(asked, missing, now=now)
        if missing:
            self._stat("lp_verdict_waits_missed")
        return verifier.settle(set(), set(), now=now)
