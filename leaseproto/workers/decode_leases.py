"""Decode rank 0's side of the leases: heartbeats to every P engine it depends
on, and what comes back from P (NACKs, lost peers).

:class:`DecodeLeases` is the part of :class:`~leaseproto.workers.decode.DecodeWorker`
that talks to P engines about leases; the worker supplies the state it reads
(declared below) and ``_kv_lost``, which fails a request over. Verdicts and
``LL`` are dispatched to :mod:`.decode_reads`.
"""

from __future__ import annotations

import logging

from ..core import wire
from ..core.peer import first_contact
from .decode_state import Engine, Req
from .decode_turns import TurnGrants, for_grantor
from .decode_view import DecodeView
from .notifications import NotificationGate

__all__ = ["DecodeLeases"]

log = logging.getLogger("leaseproto.decode")


class DecodeLeases(DecodeView):
    """Heartbeats and P's answers, for the decode worker."""

    #: (P engine, its agents) -> why its lease settings do not fit ours, or None
    _lease_checked: dict[tuple[str, tuple[str, ...]], str | None]
    gate: NotificationGate
    turns: TurnGrants

    def _kv_lost(self, req: Req, reason: str, *, abort: bool = False) -> None:
        raise NotImplementedError

    def _hellos(self) -> None:
        raise NotImplementedError

    def _verdict(self, sender: str, msg: wire.Ok | wire.Nack) -> None:
        raise NotImplementedError

    def _lease_lost(self, sender: str, remote_req_id: str, reason: str) -> None:
        raise NotImplementedError

    # -- lease step -----------------------------------------------------------------------
    def _pending(self) -> set[str]:
        return {
            e
            for e in self.tracker.engines()
            if e in self.engines
            and not self.engines[e].lost
            and not all(self.backend.ready(a) for a in self.engines[e].agents)
        }

    def lease_step(self) -> None:
        now = self._clock()
        for agent, reason in self.backend.take_lost_peers():
            self._peer_lost(agent, reason)
        if self.opts.policy == "lease":
            due = self.tracker.due(now=now, pending=self._pending())
            for engine_id, ids in due.items():
                self._heartbeat(engine_id, ids)
        self._hellos()
        mine: list[tuple[str, bytes]] = []  # what P says about its leases
        granted: list[tuple[str, bytes]] = []  # acts for D's cached turns
        for sender, payload in self.gate.admit(self.backend.poll()):
            (granted if for_grantor(payload) else mine).append((sender, payload))
        for sender, payload in mine:
            self._notification(sender, payload)
        if granted or len(self.turns.table) or self.turns.inbox:  # D holds cached turns
            self.turns.grant_step(granted)
        self.drops.flush()

    def _heartbeat(self, engine_id: str, ids: list[str]) -> None:
        engine = self.engines.get(engine_id)
        if engine is None or engine.lost:
            return
        # the tracker checked each id at track: encoded without the per-id checks;
        # with a cluster key each message leaves room for its frame
        room = self.config.max_notification_bytes - self.backend.frame_overhead
        payloads = self.tracker.payloads(ids, max_bytes=room)
        log.debug(
            "heartbeat to P engine %s (%d rank%s) naming %d req%s: %s",
            engine_id,
            len(engine.agents),
            "" if len(engine.agents) == 1 else "s",
            len(ids),
            "" if len(ids) == 1 else "s",
            ", ".join(ids),
        )
        self._check_first_heartbeats(ids)
        for agent in engine.agents:  # every P rank holds a shard under its own lease
            for payload in payloads:
                if not self.backend.send(agent, payload):
                    self.metrics.send_failures.inc()
                    self._engine_lost(engine, f"heartbeat to {agent} could not be sent")
                    return
                self.counts["heartbeats_sent"] += 1
                self.metrics.heartbeats.inc()
        self.metrics.heartbeat_ids.inc(len(ids))

    def _check_first_heartbeats(self, remote_ids: list[str]) -> None:
        """Warn when a first heartbeat leaves after the initial lease ran out
        (timing condition T1 broken: P may have freed the blocks already)."""
        now = self._clock()
        for rid in remote_ids:
            req = self.by_remote.get(rid)
            late = None if req is None else req.first_heartbeat(now)
            if req is not None and late is not None:
                self.counts["late_first_heartbeats"] += 1
                self.notes.drop(
                    "late first heartbeat",
                    f"req {req.req_id}: sent {late:.2f} s after its initial lease ran out "
                    "(P may already have freed its blocks)",
                )

    def _peer_lost(self, agent: str, reason: str) -> None:
        for engine in self.engines.values():
            if agent in engine.agents and not engine.lost:
                self._engine_lost(engine, f"P rank {agent}: {reason}")

    def _engine_lost(self, engine: Engine, reason: str) -> None:
        engine.lost = reason
        self.counts["engines_dropped"] += 1
        self.metrics.engines_dropped.inc()
        dropped = set(self.tracker.drop_engine(engine.engine_id))
        self.notes.drop(
            "P engine lost",
            f"{engine.engine_id} ({reason}): failing over {len(dropped)} requests",
        )
        for req in [*self.waiting, *self.running.values()]:
            if req.engine_id == engine.engine_id and req.needs_remote_kv and not req.kv_in:
                self._kv_lost(req, f"P engine {engine.engine_id} lost: {reason}")

    def _notification(self, sender: str, payload: bytes) -> None:
        try:
            msg = wire.decode(payload)
        except wire.MalformedMessage as exc:
            self._malformed(f"notification from {sender}: {exc}")
            return
        if isinstance(msg, (wire.Ok, wire.Nack)):
            self._verdict(sender, msg)
        elif isinstance(msg, wire.LeaseLost):
            self._lease_lost(sender, msg.req_id, msg.reason)
        else:
            self._malformed(f"unexpected {type(msg).__name__} from {sender}")

    def _nack(self, remote_req_id: str, reason: str, sender: str) -> None:
        self.counts["nacks"] += 1
        self.metrics.nacks.inc()
        req = self.by_remote.get(remote_req_id)
        if req is None or (req.done and (req.recompute or not req.kv_in or req.verified)):
            # forgotten, aborted, recomputed, failed, or used only after every OK
            # (a duplicate answer): nothing used unverified
            self.drops.drop(
                "late NACK",
                f"{reason} from {sender} for req {remote_req_id}, whose answer used no "
                "unverified KV",
                level=logging.INFO,
            )
            return
        if req.done:
            self.counts["nack_after_answer"] += 1
            self.drops.drop(
                "NACK after an unverified answer",
                f"{reason} from {sender} for req {req.req_id}: that answer may be wrong",
                level=logging.ERROR,
            )
            return
        self.notes.drop(
            "NACK",
            f"from {sender}: the lease of req {remote_req_id} had {reason} before the read; "
            "discarding what was read",
        )
        self._kv_lost(req, f"NACK: lease {reason} before the read")

    # -- first contact --------------------------------------------------------------------
    def _lease_mismatch(self, req: Req) -> str | None:
        """Whether P's advertised lease settings can work with our heartbeats
        (spec §5.3, T1/T2), checked at first contact with each P engine (or
        restart of one) and logged loudly once."""
        if self.opts.policy != "lease":
            return None
        key = (req.engine_id, tuple(r.agent for r in req.ranks))
        if key in self._lease_checked:
            return self._lease_checked[key]
        problem, warning = first_contact(
            [r.lease for r in req.ranks], self.config, step_time=self.opts.step_time
        )
        self._lease_checked[key] = problem
        if warning is not None:
            self.notes.drop("P engine lease settings", f"{req.engine_id}: {warning}")
        if problem is not None:
            action = (
                "refusing its requests"
                if self.opts.lease_mismatch == "refuse"
                else "serving it anyway (--lease-mismatch warn)"
            )
            self.notes.drop(
                "lease settings that do not fit ours",
                f"{action}: P engine {req.engine_id}: {problem}",
                level=logging.ERROR,
            )
        return problem
