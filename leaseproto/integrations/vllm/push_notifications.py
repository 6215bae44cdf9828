"""What the push worker does with each notification, beside pull mode's
(:mod:`.notifications`). No vLLM import.

D, the grantor of registrations:

- ``HB:leaseproto/1,...`` from a P agent: P understands ``LL:`` and ``AB:`` and
  renews our registrations (its engine is a *peer*); answered
  ``OK:leaseproto/1``; the other ids renew as any heartbeat does.
- ``<d_id>:<n>`` for a registration: P's WRITE completion, a transfer-done
  for our table (I15). ``OK``/``NK`` goes back to a peer. The receive is
  reported done when the lease completes while live; a completion after the
  lease ended is never used.
- ``AB:<d_id>``: P will not write (B9): the lease ends at once.
- A registration's acts are taken only from agents of the P engine it was
  sent to (names bound to the address D handshook with).

P, the renewer of registrations: ``OK:leaseproto/1`` (D heard our
capability), ``OK:``/``NK:`` for our WRITEs (counted; an ``NK`` logged),
``LL:<reason>:<d_id>`` (D's registration ended: P gives it up and, if no WRITE
of it started, says ``AB:``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from leaseproto import LateTransfer, Release, ReleaseReason, TransferCounted, wire

from .notifications import NotificationHandling
from .verify import agent_name

if TYPE_CHECKING:
    from leaseproto import HeartbeatTracker

    from .push import PushWrites, Registrations

__all__ = ["PushNotifications"]

logger = logging.getLogger("vllm.leaseproto.worker")

#: Settled registrations remembered, to recognise a late completion (oldest dropped).
_SETTLED = 4096


class PushNotifications(NotificationHandling):
    """Mixed into :class:`~.push_worker.LeaseprotoPushConnectorWorker`."""

    _remote_agents: dict[str, dict[tuple[int, int], Any]]
    _recving_metadata: dict[str, Any]
    _recving_transfers: dict[str, list[int]]
    _recv_failures: set[str]
    _pending_completion_notifs: Any  # vLLM's queue of what its writer forwards
    world_size: int

    if TYPE_CHECKING:

        def _registrations(self) -> Registrations: ...

        def _writes(self) -> PushWrites: ...

        def _push_tracker(self) -> HeartbeatTracker: ...

        def _ensure_handshake(self, engine_id: str, *args: Any) -> Any: ...

        def _handle_failed_transfer(
            self,
            req_id: str,
            handle: int | None,
            failed_req_ids: set[str] | None = None,
            record_failed_transfer: bool = True,
        ) -> bool: ...

    # -- state --------------------------------------------------------------------------------
    def _settled(self) -> OrderedDict[str, str]:
        """Registrations settled lately -> their P engine."""
        out: OrderedDict[str, str] = self.__dict__.setdefault("_lp_settled_regs", OrderedDict())
        return out

    def _peers(self) -> set[str]:
        """P agents that said ``leaseproto/1`` (their capability heartbeat)."""
        out: set[str] = self.__dict__.setdefault("_lp_push_peers", set())
        return out

    def _lost_engines(self) -> set[str]:
        out: set[str] = self.__dict__.setdefault("_lp_lost_engines", set())
        return out

    def _engine_of_agent(self, agent: str) -> str | None:
        for engine, agents in list(self._remote_agents.items()):
            if agent in {agent_name(a) for a in list(agents.values())}:
                return engine
        return None

    def _registration_engine(self, d_id: str) -> str | None:
        return self._registrations().engine(d_id) or self._settled().get(d_id)

    # -- hooks of NotificationHandling ------------------------------------------------------
    def _admit(self, req_id: str, agent: str, *, now: float, act: str, readers: int = 1) -> bool:
        engine = self._registration_engine(req_id)
        if engine is None:
            return super()._admit(req_id, agent, now=now, act=act, readers=readers)
        agents = self._remote_agents.get(engine, {})
        return agent in {agent_name(a) for a in list(agents.values())}

    def _answers_to(self, agent: str) -> bool:
        return agent in self._peers() or super()._answers_to(agent)

    def _lease_ids(self, ids: tuple[str, ...]) -> tuple[str, ...]:
        """B2: a heartbeat naming D's id or the router's for a lease of ours
        renews it; P's and D's ids differ only in vLLM's random suffix."""
        from .push import base_id

        table = self._leases().table
        if all(i in table for i in ids):
            return ids
        by_base: dict[str, list[str]] = {}
        for rid in table.live():
            by_base.setdefault(base_id(rid), []).append(rid)
        out: dict[str, None] = {}
        for i in ids:
            for rid in [i] if i in table else by_base.get(base_id(i), [i]):
                out[rid] = None
        return tuple(out)

    # -- dispatch -----------------------------------------------------------------------------
    def _on_notification(self, agent: str, raw: bytes, done: set[str]) -> None:
        self._lost_engines().discard(self._engine_of_agent(agent) or "")
        try:
            msg = wire.decode(raw)
        except wire.MalformedMessage:
            super()._on_notification(agent, raw, done)  # hello or malformed: as in pull mode
            return
        if isinstance(msg, wire.Heartbeat) and wire.CAPABILITY in msg.ids:
            self._peers().add(agent)
            engine = self._engine_of_agent(agent)
            if engine is not None:
                self._registrations().peer_engines.add(engine)
            self._renew(tuple(i for i in msg.ids if i != wire.CAPABILITY), agent, raw)
            self._answer(agent, wire.Ok(wire.CAPABILITY))
        elif isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
            self.__dict__.setdefault("_lp_acked", set()).add(agent)
        elif isinstance(msg, (wire.Ok, wire.Nack)):
            self._write_verdict(msg, agent)
        elif isinstance(msg, wire.LeaseLost):
            self._stat("lp_push_lease_lost")
            held = self._writes().cancel(msg.req_id)
            if held is not None:  # D's registration ended and no WRITE of it started
                self._abort_to_d(held.d_id, held.engine, held.host, held.port, held.tp)
            self._push_tracker().untrack(msg.req_id)
        elif isinstance(msg, wire.TransferDone) and self._registration_engine(msg.req_id):
            self._completion(msg, agent, raw)
        elif isinstance(msg, wire.Abort) and self._registration_engine(msg.req_id):
            self._aborted_by_p(msg.req_id, agent, raw)
        elif isinstance(msg, wire.TransferDone) and self._vllms_receive(msg.req_id):
            self._pending_completion_notifs.put(raw)  # no registration of ours: vLLM's path
        else:
            super()._on_notification(agent, raw, done)

    def _vllms_receive(self, req_id: str) -> bool:
        """A receive vLLM tracks with no lease of ours for it (never registered here)."""
        table = self._leases().table
        return (
            req_id in self._recving_metadata and req_id not in table and table.ended(req_id) is None
        )

    def _write_verdict(self, msg: wire.Ok | wire.Nack, agent: str) -> None:
        """P: D's verdict on one of our WRITEs (what D does with it is D's)."""
        if isinstance(msg, wire.Ok):
            self._stat("lp_push_writes_confirmed")
            return
        self._stat("lp_push_writes_refused")
        self._notes().drop(
            "write refused",
            f"registration {msg.req_id}: {agent} answered NK:{msg.reason}; the decoder does "
            "not use what was written and recomputes it",
        )

    # -- D: completions and aborts of registrations ------------------------------------------
    def _completion(self, msg: wire.TransferDone, agent: str | None, raw: bytes) -> None:
        lp = self._leases()
        now, d_id = lp.now(), msg.req_id
        if agent is not None and not self._admit(d_id, agent, now=now, act="transfer"):
            self._handled(agent, raw, now, (d_id,))
            self._foreign("write completion", d_id, agent)
            return
        meta = self._recving_metadata.get(d_id)
        readers = int(getattr(meta, "pp_size", 1)) * max(1, msg.count // max(1, self.world_size))
        if agent is not None:
            self._handled(agent, raw, now, readers=readers)
        result = lp.transfer_done(d_id, readers, now=now)
        self._registrations().reported(d_id, agent)
        if agent is not None and self._answers_to(agent):
            self._answer(agent, wire.verdict(d_id, result))
        if isinstance(result, Release):
            self._registration_ended(result)
        elif not isinstance(result, TransferCounted):
            ended = result.ended.value if isinstance(result, LateTransfer) else "unknown"
            self._stat("lp_push_writes_refused")
            self._notes().drop(
                "late write",
                f"registration {d_id}: a WRITE completed after the registration ended "
                f"({ended}); what it wrote is not used (recomputed under "
                "kv_load_failure_policy=recompute)",
            )
        self._release_quarantined()

    def _aborted_by_p(self, d_id: str, agent: str, raw: bytes) -> None:
        lp = self._leases()
        now = lp.now()
        if not self._admit(d_id, agent, now=now, act="abort"):
            self._handled(agent, raw, now, (d_id,))
            self._foreign("abort", d_id, agent)
            return
        self._handled(agent, raw, now)
        release = lp.table.abort(d_id, now=now)
        self._registrations().reported(d_id, agent)
        if release is not None:
            lp.trace.release(release, 0)
            self._stat("lp_aborted")
            self._registration_ended(release, why="the prefill engine aborted it")
        self._release_quarantined()

    def _registration_ended(self, release: Release, why: str | None = None) -> None:
        """D: the lease of a registration ended: used (TRANSFERRED), or failed
        at once (a stock P: vLLM's watchdog), or held until P is done with it."""
        d_id = release.req_id
        if release.reason is ReleaseReason.TRANSFERRED:
            self._settle(d_id, ok=True, how="verified")
            return
        regs = self._registrations()
        why = why or f"registration {release.reason.value}"
        now = self._leases().now()
        if regs.failed(d_id, now=now, why=why):
            self._stat("lp_push_quarantined")
            self._notes().drop(
                "registration held",
                f"{d_id}: {why}; its blocks stay with it until the prefill engine completes "
                "or aborts its WRITE, or is forgotten",
                level=logging.INFO,
            )
            return
        engine = regs.engine(d_id) or "?"
        said: set[str] = self.__dict__.setdefault("_lp_stock_logged", set())
        if engine not in said:
            said.add(engine)
            logger.warning(
                "Prefill engine %s did not say %s: its registrations end after "
                "push_registration_timeout (vLLM's watchdog), unverified, and the request "
                "is recomputed (kv_load_failure_policy)",
                engine,
                wire.CAPABILITY,
            )
        self._settle(d_id, ok=False, how=why)

    def _settle(self, d_id: str, *, ok: bool, how: str) -> None:
        """Tell vLLM about the receive of ``d_id``: done, or failed (recomputed)."""
        regs = self._registrations()
        settled = self._settled()
        settled[d_id] = regs.engine(d_id) or ""
        while len(settled) > _SETTLED:
            settled.popitem(last=False)
        regs.drop(d_id)
        if d_id not in self._recving_metadata:
            return  # vLLM's own failure path reported it already
        if ok:
            self._recving_transfers.setdefault(d_id, [])
            self._leases().trace.emit("use", req=d_id, remote=d_id, kind="push")
            self._stat("lp_push_writes_verified")
            return
        self._handle_failed_transfer(d_id, None, self._recv_failures, record_failed_transfer=False)
        self._stat("lp_push_recv_failed")
        self._notes().drop(
            "push receive failed",
            f"request {d_id}: {how}; the request fails its KV load (recomputed under "
            "kv_load_failure_policy=recompute)",
        )

    def _release_quarantined(self) -> None:
        regs = self._registrations()
        if not len(regs):
            return
        lp = self._leases()
        for d_id in regs.ids():
            if d_id not in self._recving_metadata and not regs.failing(d_id):
                lp.abort(d_id)  # vLLM reported it on its own failure path
                regs.drop(d_id)
        forgotten = {e for e in regs.peer_engines if e not in self._remote_agents}
        for d_id, why in regs.released(now=lp.now(), forgotten=forgotten | self._lost_engines()):
            self._settle(d_id, ok=False, how=why)

    def _unsent(self, agent: str) -> None:
        engine = self._engine_of_agent(agent)
        if engine is not None and engine in self._registrations().peer_engines:
            self._lost_engines().add(engine)

    # -- P: aborting a registration -------------------------------------------------------------
    def _pending_aborts(self) -> dict[str, tuple[str, str, int, int]]:
        out: dict[str, tuple[str, str, int, int]] = self.__dict__.setdefault("_lp_aborts", {})
        return out

    def _abort_to_d(self, d_id: str, engine: str, host: str, port: int, tp: int) -> None:
        """P: tell D's engine we will not write ``d_id`` (once a handshake lets us)."""
        self._push_tracker().untrack(d_id)
        self._pending_aborts()[d_id] = (engine, host, port, tp)
        self._send_pending_aborts()

    def _send_pending_aborts(self) -> None:
        pending = self._pending_aborts()
        for d_id, (engine, host, port, tp) in list(pending.items()):
            if self._ensure_handshake(engine, host, port, tp) is not None:
                continue  # sent once the handshake is done
            del pending[d_id]
            for agent in list(self._remote_agents.get(engine, {}).values()):
                try:
                    self.nixl_wrapper.send_notif(agent, notif_msg=wire.encode_abort(d_id))
                    self._stat("lp_push_aborts_sent")
                except Exception as exc:
                    self._drops().drop("unsent abort", f"{d_id} to {agent_name(agent)}: {exc!r}")
