"""What the push worker does with each notification, beside pull mode's
(:mod:`.notifications`). No vLLM import.

D, the grantor of registrations (what becomes of them: :mod:`.push_decoder`):

- ``HB:leaseproto/1,...`` from a P agent: P understands ``LL:`` and ``AB:`` and
  renews our registrations (its engine is a *peer*); answered
  ``OK:leaseproto/1``; the other ids renew as any heartbeat does.
- ``<d_id>:<n>`` for a registration: a writer's WRITE completion (I15);
  ``AB:<d_id>``: a writer will not write (B9).
- A registration's acts are taken only from agents of the P engine it was
  sent to (names bound to the address D handshook with).

P, the renewer of registrations: ``OK:leaseproto/1`` (D heard our
capability), ``OK:``/``NK:`` for our WRITEs (counted; an ``NK`` logged),
``LL:<reason>:<d_id>`` (D's registration ended: P gives it up and, if no WRITE
of it started, says ``AB:``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from leaseproto import wire

from .push_decoder import PushDecoder
from .verify import agent_name

if TYPE_CHECKING:
    from leaseproto import HeartbeatTracker

    from .push import PushWrites

__all__ = ["PushNotifications"]

logger = logging.getLogger("vllm.leaseproto.worker")


class PushNotifications(PushDecoder):
    """Mixed into :class:`~.push_worker.LeaseprotoPushConnectorWorker`."""

    _pending_completion_notifs: Any  # vLLM's queue of what its writer forwards

    if TYPE_CHECKING:

        def _writes(self) -> PushWrites: ...

        def _push_tracker(self) -> HeartbeatTracker: ...

        def _ensure_handshake(self, engine_id: str, *args: Any) -> Any: ...

    # -- state --------------------------------------------------------------------------------
    def _peers(self) -> set[str]:
        """P agents that said ``leaseproto/1`` (their capability heartbeat)."""
        out: set[str] = self.__dict__.setdefault("_lp_push_peers", set())
        return out

    def _engine_of_agent(self, agent: str) -> str | None:
        for engine, agents in list(self._remote_agents.items()):
            if agent in {agent_name(a) for a in list(agents.values())}:
                return engine
        return None

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
        self._heard_from(agent)
        try:
            msg = wire.decode(raw)
        except wire.MalformedMessage:
            super()._on_notification(agent, raw, done)  # hello or malformed: as in pull mode
            return
        if isinstance(msg, wire.Heartbeat) and wire.CAPABILITY in msg.ids:
            self._peers().add(agent)
            engine = self._engine_of_agent(agent)
            if engine is not None:
                self._peer_engines().add(engine)
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
