"""The leases decode rank 0 holds at P engines (:class:`PLeases`): which P
engines it depends on, the heartbeats that renew their leases, and what P says
of them (a NACK, an ``LL``, a lost peer).

A part of :class:`~leaseproto.workers.decode.DecodeWorker`, owning its state:
the core's :class:`~leaseproto.HeartbeatTracker` (a request is tracked from its
arrival until its READs are done or it fails over), the P engines
(:class:`~.decode_state.Engine`: their ranks' agents, and why an engine was
lost) and the first-contact check of each engine's lease settings. It decides;
the worker fails requests over: a method that loses engines returns them, and
one that judges a NACK or an ``LL`` returns whether the request gives up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..core import wire
from ..core.peer import first_contact
from ..core.tracker import HeartbeatTracker
from . import verdicts
from .backend import KVBackend
from .decode_state import DecodeOptions, Engine, Reporting, Req

__all__ = ["PLeases"]

log = logging.getLogger("leaseproto.decode")


class PLeases:
    """The P engines decode rank 0 depends on and its heartbeats to them."""

    def __init__(
        self, opts: DecodeOptions, backend: KVBackend, out: Reporting, tracker: HeartbeatTracker
    ) -> None:
        """``tracker``: a new one, made by the worker (its metrics read it)."""
        self.opts = opts
        self.config = opts.config
        self.backend = backend
        self.out = out
        self.tracker = tracker
        self.engines: dict[str, Engine] = {}
        #: (P engine, its agents) -> why its lease settings do not fit ours, or None
        self._checked: dict[tuple[str, tuple[str, ...]], str | None] = {}

    # -- first contact --------------------------------------------------------------------
    def mismatch(self, req: Req) -> str | None:
        """Whether P's advertised lease settings can work with our heartbeats
        (spec §5.3, T1/T2), checked at first contact with each P engine (or
        restart of one) and logged loudly once."""
        if self.opts.policy != "lease":
            return None
        key = (req.engine_id, tuple(r.agent for r in req.ranks))
        if key in self._checked:
            return self._checked[key]
        problem, warning = first_contact(
            [r.lease for r in req.ranks], self.config, step_time=self.opts.step_time
        )
        self._checked[key] = problem
        if warning is not None:
            self.out.notes.drop("P engine lease settings", f"{req.engine_id}: {warning}")
        if problem is not None:
            action = (
                "refusing its requests"
                if self.opts.lease_mismatch == "refuse"
                else "serving it anyway (--lease-mismatch warn)"
            )
            self.out.notes.drop(
                "lease settings that do not fit ours",
                f"{action}: P engine {req.engine_id}: {problem}",
                level=logging.ERROR,
            )
        return problem

    def engine(self, req: Req) -> tuple[Engine, bool]:
        """The P engine of ``req``, and whether it is new: the first sight of an
        engine (or of new agents for it, a restarted P) starts the NIXL handshake
        with each of its ranks in the background. Raises ``ValueError`` when NIXL
        refuses an address (nothing kept)."""
        agents = tuple(r.agent for r in req.ranks)
        engine = self.engines.get(req.engine_id)
        if engine is not None and engine.agents == agents:
            return engine, False
        engine = Engine(req.engine_id, agents, list(req.ranks))
        for rank in req.ranks:
            # keyed: P advertised our cluster key (checked at intake), seal for it
            self.backend.connect(
                rank.agent,
                rank.host,
                rank.nixl_port,
                keyed=rank.key_id is not None,
                layout=rank.layout,
            )
        self.engines[req.engine_id] = engine
        self.out.notes.drop(
            "handshake started",
            f"with P engine {req.engine_id} ({len(req.ranks)} ranks)",
            level=logging.INFO,
        )
        return engine, True

    def connected(self, req: Req) -> Engine | None:
        """``req``'s P engine once every one of its ranks is connected, else None."""
        engine = self.engines.get(req.engine_id)
        if engine is None or not all(self.backend.is_connected(r.agent) for r in req.ranks):
            return None
        return engine

    # -- the heartbeats -------------------------------------------------------------------
    def track(self, req: Req, *, now: float) -> None:
        """Heartbeat ``req``'s lease from now on (lease policy). Raises
        :class:`~leaseproto.LocalProtocolError` for an id too long for a heartbeat."""
        if self.opts.policy == "lease":
            self.tracker.track(
                req.req_id, engine_id=req.engine_id, remote_req_id=req.remote_req_id, now=now
            )

    def untrack(self, req_id: str) -> None:
        self.tracker.untrack(req_id)

    def heartbeats(self, *, now: float, by_remote: Mapping[str, Req]) -> list[Engine]:
        """Send the heartbeats due now, each to **every** P rank of its engine;
        the engines lost because one could not be sent (``by_remote``: the
        requests by P's id, for the first-heartbeat check)."""
        if self.opts.policy != "lease":
            return []
        pending = {  # engines still in their handshake: not due yet (T1 allows for it)
            e
            for e in self.tracker.engines()
            if e in self.engines
            and not self.engines[e].lost
            and not all(self.backend.ready(a) for a in self.engines[e].agents)
        }
        lost = []
        for engine_id, ids in self.tracker.due(now=now, pending=pending).items():
            engine = self.engines.get(engine_id)
            if engine is None or engine.lost:
                continue
            self._check_first_heartbeats(ids, now=now, by_remote=by_remote)
            if not self._heartbeat(engine, ids):
                lost.append(engine)
        return lost

    def _heartbeat(self, engine: Engine, ids: list[str]) -> bool:
        """One heartbeat naming ``ids`` to every rank of ``engine``; False when a
        send failed (the engine is then lost)."""
        # the tracker checked each id at track: encoded without the per-id checks;
        # with a cluster key each message leaves room for its frame
        room = self.config.max_notification_bytes - self.backend.frame_overhead
        payloads = self.tracker.payloads(ids, max_bytes=room)
        log.debug(
            "heartbeat to P engine %s (%d rank%s) naming %d req%s: %s",
            engine.engine_id,
            len(engine.agents),
            "" if len(engine.agents) == 1 else "s",
            len(ids),
            "" if len(ids) == 1 else "s",
            ", ".join(ids),
        )
        for agent in engine.agents:  # every P rank holds a shard under its own lease
            for payload in payloads:
                if not self.backend.send(agent, payload):
                    self.out.metrics.send_failures.inc()
                    self.lose(engine, f"heartbeat to {agent} could not be sent")
                    return False
                self.out.counts["heartbeats_sent"] += 1
                self.out.metrics.heartbeats.inc()
        self.out.metrics.heartbeat_ids.inc(len(ids))
        return True

    def _check_first_heartbeats(
        self, remote_ids: list[str], *, now: float, by_remote: Mapping[str, Req]
    ) -> None:
        """Warn when a first heartbeat leaves after the initial lease ran out
        (timing condition T1 broken: P may have freed the blocks already)."""
        for rid in remote_ids:
            req = by_remote.get(rid)
            late = None if req is None else req.first_heartbeat(now)
            if req is not None and late is not None:
                self.out.counts["late_first_heartbeats"] += 1
                self.out.notes.drop(
                    "late first heartbeat",
                    f"req {req.req_id}: sent {late:.2f} s after its initial lease ran out "
                    "(P may already have freed its blocks)",
                )

    def abort(self, req: Req) -> None:
        """Tell every P rank of ``req`` to free its blocks now (``AB:``, best
        effort; not to an engine that is gone)."""
        engine = self.engines.get(req.engine_id)
        if engine is not None and not engine.lost:
            for rank in req.ranks:
                self.backend.send(rank.agent, wire.encode_abort(req.remote_req_id))

    # -- engines lost ---------------------------------------------------------------------
    def peer_lost(self, agent: str, reason: str) -> list[Engine]:
        """NIXL lost ``agent``: the engines it is a rank of are lost (returned)."""
        lost = [e for e in self.engines.values() if agent in e.agents and not e.lost]
        for engine in lost:
            self.lose(engine, f"P rank {agent}: {reason}")
        return lost

    def lose(self, engine: Engine, reason: str) -> None:
        """Mark ``engine`` lost and stop heartbeating it (the worker then fails
        its requests over)."""
        engine.lost = reason
        self.out.counts["engines_dropped"] += 1
        self.out.metrics.engines_dropped.inc()
        dropped = set(self.tracker.drop_engine(engine.engine_id))
        self.out.notes.drop(
            "P engine lost",
            f"{engine.engine_id} ({reason}): failing over {len(dropped)} requests",
        )

    # -- what P says of a lease -----------------------------------------------------------
    def nack(self, req: Req | None, remote_req_id: str, reason: str, sender: str) -> bool:
        """A NACK for ``remote_req_id`` (``req``: ours, if known): whether the
        request gives up what it read (the worker recomputes or fails it)."""
        self.out.counts["nacks"] += 1
        self.out.metrics.nacks.inc()
        if req is None or (req.done and (req.recompute or not req.kv_in or req.verified)):
            # forgotten, aborted, recomputed, failed, or used only after every OK
            # (a duplicate answer): nothing used unverified
            self.out.drops.drop(
                "late NACK",
                f"{reason} from {sender} for req {remote_req_id}, whose answer used no "
                "unverified KV",
                level=logging.INFO,
            )
            return False
        if req.done:
            self.out.counts["nack_after_answer"] += 1
            self.out.drops.drop(
                "NACK after an unverified answer",
                f"{reason} from {sender} for req {req.req_id}: that answer may be wrong",
                level=logging.ERROR,
            )
            return False
        self.out.notes.drop(
            "NACK",
            f"from {sender}: the lease of req {remote_req_id} had {reason} before the read; "
            "discarding what was read",
        )
        return True

    def lease_lost(self, req: Req | None, remote_req_id: str, reason: str, sender: str) -> bool:
        """Advisory ``LL``: P no longer holds the lease a heartbeat named. Whether
        ``req`` gives up early (only before any of its reads started; one reading
        waits for its verdict, which always wins)."""
        self.out.counts["lease_lost"] += 1
        self.out.counts["nacks"] += 1
        self.out.metrics.nacks.inc()
        if (
            req is None
            or req.done
            or not req.needs_remote_kv
            or not verdicts.lease_lost_gives_up(reading=req.state != "waiting")
        ):
            log.debug("LL (%s) from %s for req %s: ignored", reason, sender, remote_req_id)
            return False
        self.out.notes.drop(
            "LL",
            f"from {sender}: P no longer holds the lease of req {req.req_id} ({reason}); "
            "recomputing before any read",
        )
        return True
