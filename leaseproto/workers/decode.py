"""Decode rank 0: scheduler, heartbeats and the model. Ranks 1.. read their
share of the heads and hand it over (:mod:`.decode_follower`).

One single-threaded loop (:meth:`DecodeWorker.step`):

1. **intake**: a ``decode`` request enters the waiting queue and is tracked
   (``HeartbeatTracker.track``) at that moment, not when scheduled. The first
   request naming a P engine starts the handshake with its ranks in the
   background (:meth:`NixlEndpoint.connect` never blocks);
2. **lease step** (:mod:`.decode_leases`): ``due(now=..., pending=<engines not
   connected yet>)``; each due engine's ids through ``wire.encode_heartbeat`` to
   **every** P rank of it. A failed send or a lost peer drops the engine
   (``drop_engine``) and fails its requests over; NACKs are handled here;
3. **schedule**: waiting requests enter the bounded running set as blocks
   allow; their READs start (transfer-done attached);
4. **compute**: one decode step of the running set.

Fail-over (P gone, READ failed, NACK) discards what was read and recomputes
locally (``on_kv_loss="recompute"``: same model, same tokens) or answers with
a clear error (``"error"``): never an uncaught exception, never a hang.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import deque
from typing import Any

import zmq

from ..core import wire
from ..core.errors import LocalProtocolError
from ..core.tracker import HeartbeatTracker
from .backend import KVBackend
from .decode_follower import Followers
from .decode_leases import DecodeLeases
from .decode_reads import DecodeReads
from .decode_state import DecodeOptions, Engine, PAgent, Req
from .decode_turns import TurnGrants
from .keys import curve, key_mismatch
from .loop import IDLE_WAIT_S, PENDING_WAIT_S, EngineLoop, wait_for_input
from .metrics import DecodeMetrics, stats_dict
from .notifications import DropLog, NotificationGate
from .plane import Msg, Server

__all__ = ["DecodeOptions", "DecodeWorker"]

log = logging.getLogger("leaseproto.decode")


#: What the decode worker counts (its ``stats``).
# fmt: off
_COUNTS = (
    "completed", "recomputed", "failed", "nacks", "nack_after_answer", "malformed",
    "heartbeats_sent", "engines_dropped", "late_first_heartbeats", "verified_reads",
    "unverified_reads", "verdicts_nk", "verdict_timeouts", "verdict_wait_us", "lease_lost",
    "foreign_verdicts", "contradicting_requests", "handshake_timeouts",
)
# fmt: on


class DecodeWorker(DecodeReads, DecodeLeases, EngineLoop):
    """Decode rank 0: schedules, heartbeats and decodes."""

    def __init__(self, opts: DecodeOptions, *, backend: KVBackend | None = None) -> None:
        """``backend``: a stand-in for a new :class:`KVBackend` (tests)."""
        opts.validate()
        self.opts = opts
        self.config = opts.config
        self.tracker = HeartbeatTracker(opts.config)
        self.backend = backend or KVBackend(
            opts, agent_name=f"decode-r0-{secrets.token_hex(3)}", role="decode", full_heads=True
        )
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        keys = curve(opts.cluster_key)
        self.server = Server(self.ctx, opts.host, opts.port, curve=keys)
        self.followers = Followers(self.ctx, opts.followers, curve=keys)
        self.metrics = DecodeMetrics(
            opts.engine_id, opts.rank, tracker_stats=lambda: self.tracker.stats
        )
        if opts.metrics_port is not None:
            self.metrics.serve(opts.host, opts.metrics_port)
        self.waiting: deque[Req] = deque()
        self.running: dict[str, Req] = {}
        self.by_remote: dict[str, Req] = {}  # P's id -> request (for NACKs)
        self.engines: dict[str, Engine] = {}
        self.verdict_agents: dict[str, PAgent] = {}
        self.verdict_engines: set[str] = set()
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.drops = DropLog(log)
        self.notes = DropLog(log, prefix="", max_detail=480)
        self.gate = NotificationGate(
            self.drops, max_bytes=opts.max_notification_in, known=self.backend.is_connected
        )
        self._now = -math.inf
        self._lease_checked = {}
        #: D as a grantor: cached turns under leases P reads (issue 18)
        self.turns = TurnGrants(opts, self.backend, self.gate, self.metrics)

    def ready_info(self) -> dict[str, Any]:
        return {
            "role": "decode",
            "host": self.opts.host,
            "port": self.server.port,
            "metrics_port": self.metrics.port,
            "nixl_port": self.backend.nixl_port,
            "agent": self.backend.agent_name,
            "rank": 0,
            "tp": self.opts.tp,
        }

    def pong(self) -> Msg:
        return {
            "role": "decode",
            "tp": self.opts.tp,
            "agent": self.backend.agent_name,
            # every rank's NIXL agent, as far as known: the router names them to P
            "agents": [self.backend.agent_name, *self.followers.agent_names()],
            "limits": self.backend.limits(),
        }

    def _clock(self) -> float:
        self._now = max(self._now, time.monotonic())
        return self._now

    # -- intake ---------------------------------------------------------------------------
    def _request(self, envelope: list[bytes], msg: Msg) -> None:
        op = msg["op"]
        if op == "decode":
            self._intake(envelope, msg)
        elif op == "abort":
            self._abort_request(msg.get("req_id"))
        elif not self.common_op(envelope, msg):
            self._malformed(f"unknown op {op!r}")
            self.server.reply(envelope, {"op": "error", "error": f"unknown op {op!r}"})

    def _malformed(self, why: str) -> None:
        self.counts["malformed"] += 1
        self.metrics.malformed.inc()
        self.drops.drop("malformed message", why)

    def _intake(self, envelope: list[bytes], msg: Msg) -> None:
        try:
            req = Req.from_msg(envelope, msg, now=self._clock(), block_size=self.opts.block_size)
            problem = self.backend.check_prompt(req.prompt, req.max_tokens, req.first_token)
            if problem is None and self.backend.agent_name in {r.agent for r in req.ranks}:
                problem = "transfer parameters name this decode worker's own NIXL agent"
            if problem is not None:
                raise ValueError(problem)
        except ValueError as exc:
            self._malformed(str(exc))
            self._refuse(envelope, msg.get("req_id"), str(exc))
            return
        if req.req_id in self.running or any(r.req_id == req.req_id for r in self.waiting):
            self._refuse(envelope, req.req_id, "duplicate request id")
            return
        problem = key_mismatch(req.ranks, self.opts.cluster_key)
        if problem is not None:
            self.counts["failed"] += 1
            self.drops.drop("request of a P engine with another cluster key", problem)
            self._refuse(envelope, req.req_id, f"refused P engine {req.engine_id}: {problem}")
            return
        if (problem := self._contradiction(req)) is not None:  # counted and logged there
            self._refuse(envelope, req.req_id, problem)
            return
        problem = self._lease_mismatch(req)
        if problem is not None and self.opts.lease_mismatch == "refuse":
            self.counts["failed"] += 1
            self._refuse(envelope, req.req_id, f"refused P engine {req.engine_id}: {problem}")
            return
        try:
            engine = self._engine(req)
        except ValueError as exc:  # an address NIXL refuses: this request only
            self._malformed(f"transfer parameters of req {req.req_id}: {exc}")
            self._finish(req, ok=False, error=f"unusable transfer parameters: {exc}")
            return
        self.waiting.append(req)
        self.by_remote[req.remote_req_id] = req
        if engine.lost:
            self._kv_lost(req, f"P engine {engine.engine_id} is gone ({engine.lost})")
        elif self.opts.policy == "lease":
            try:
                self.tracker.track(
                    req.req_id,
                    engine_id=req.engine_id,
                    remote_req_id=req.remote_req_id,
                    now=self._clock(),
                )
            except LocalProtocolError as exc:  # an id too long for our heartbeats
                self._malformed(f"req {req.req_id}: {exc}")
                self._finish(req, ok=False, error=str(exc))

    def _refuse(self, envelope: list[bytes], req_id: object, error: str) -> None:
        """Answer a ``decode`` request that will not be served."""
        self.server.reply(
            envelope, {"op": "decoded", "req_id": req_id, "ok": False, "tokens": [], "error": error}
        )

    def _engine(self, req: Req) -> Engine:
        """The P engine of ``req``; the first sight of an engine (or of new
        agents for it, a restarted P) starts the handshake in the background.
        Then decides whether ``req``'s reads wait for verdicts (:meth:`_decide`)."""
        agents = tuple(r.agent for r in req.ranks)
        engine = self.engines.get(req.engine_id)
        if engine is None or engine.agents != agents:
            engine = Engine(req.engine_id, agents, list(req.ranks))
            for rank in req.ranks:  # ValueError: NIXL refuses the address; nothing kept
                # keyed: P advertised our cluster key (checked at intake), seal for it
                self.backend.connect(
                    rank.agent,
                    rank.host,
                    rank.nixl_port,
                    keyed=rank.key_id is not None,
                    layout=rank.layout,
                )
            self.engines[req.engine_id] = engine
            self.followers.connect(req.ranks)
            self.notes.drop(
                "handshake started",
                f"with P engine {req.engine_id} ({len(req.ranks)} ranks)",
                level=logging.INFO,
            )
        self._decide(req)
        return engine

    # -- fail-over ------------------------------------------------------------------------
    def _kv_lost(self, req: Req, reason: str, *, abort: bool = False) -> None:
        """P's KV for ``req`` is unusable: recompute locally or fail. ``abort``:
        P may still hold it (a failed read, not a lost P or a NACK), so tell P
        to free it now rather than at expiry (``AB:``, best effort)."""
        if req.done or not req.needs_remote_kv:
            return  # already failed over (several P ranks may report the same loss)
        self._drop_remote(req, abort=abort)
        if self.opts.on_kv_loss == "error":
            self.metrics.failovers.labels(action="error").inc()
            self._finish(req, ok=False, error=f"KV of req {req.req_id} lost: {reason}")
            return
        self.metrics.failovers.labels(action="recompute").inc()
        req.recompute = True
        req.needs_remote_kv = False
        log.info("req %s will be recomputed locally: %s", req.req_id, reason)
        if req.req_id in self.running and req.blocks:
            self._recompute(req)

    def _drop_remote(self, req: Req, *, abort: bool) -> None:
        """Stop heartbeating and reading ``req``'s KV at P (``abort``: tell P)."""
        self.tracker.untrack(req.req_id)
        engine = self.engines.get(req.engine_id)
        if abort and engine is not None and not engine.lost:
            for rank in req.ranks:
                self.backend.send(rank.agent, wire.encode_abort(req.remote_req_id))
        for xfer in req.transfers:
            self.backend.release(xfer)
        req.transfers.clear()
        if req.followers_pending:  # their reads end unfinished and unanswered
            self.followers.abort(req.req_id)
        req.followers_pending.clear()

    def _abort_request(self, req_id: object) -> None:
        """The router gave up on ``req_id``: drop it, and free P's blocks now."""
        req = next((r for r in [*self.waiting, *self.running.values()] if r.req_id == req_id), None)
        if req is None:
            return
        log.info("req %s aborted by the router", req.req_id)
        if req.needs_remote_kv and not req.kv_in:
            self._drop_remote(req, abort=True)
        self._finish(req, ok=False, error="aborted by the router")

    def _recompute(self, req: Req) -> None:
        req.start_token = self.backend.prefill(req.prompt, req.blocks)
        req.tokens.clear()
        req.state = "decoding"
        self.counts["recomputed"] += 1

    # -- schedule and compute -------------------------------------------------------------
    def schedule(self) -> None:
        for req in list(self.waiting):
            if len(self.running) >= self.opts.max_running:
                return
            if req.needs_remote_kv and not self._ready_to_read(req):
                continue  # its handshake is still running; let others go first
            # a turn to cache keeps its generated tokens' K/V too (all but the last)
            blocks = self.backend.alloc_for(req.num_tokens + req.cache_turn * (req.max_tokens - 1))
            if blocks is None:
                return
            self.waiting.remove(req)
            self.running[req.req_id] = req
            req.blocks = blocks
            if req.recompute or not req.needs_remote_kv:
                self._recompute(req)
            else:
                self._start_reads(req)

    def compute(self) -> None:
        """One decode step of the running set. The model produces a request's
        tokens in one call when its KV is in; the request then holds its slot
        for one step per further token (``step_time`` each, the modelled
        forward pass), as a batch member would."""
        stepped = False
        for req in list(self.running.values()):
            if req.state != "decoding":
                continue
            if not req.tokens:
                try:
                    req.tokens = self.backend.decode(
                        req.blocks,
                        req.num_tokens,
                        req.start_token,
                        req.max_tokens,
                        keep=req.cache_turn,
                    )
                except (ValueError, IndexError, RuntimeError) as exc:  # never stop the loop
                    self.notes.drop(
                        "decode failed", f"req {req.req_id}: {exc}", level=logging.ERROR
                    )
                    self._finish(req, ok=False, error=f"decode failed: {exc}")
                    continue
                req.steps_left = req.max_tokens - 1
            if req.steps_left > 0:
                req.steps_left -= 1
                stepped = True
            if req.steps_left <= 0:
                self._finish(req, ok=True)
        if stepped and self.opts.step_time > 0:
            time.sleep(self.opts.step_time)  # the modelled forward pass

    def _finish(self, req: Req, *, ok: bool, error: str | None = None) -> None:
        self.tracker.untrack(req.req_id)
        if req.req_id in self.running:
            del self.running[req.req_id]
        elif req in self.waiting:
            self.waiting.remove(req)
        cache = self.turns.keep(req) if ok and req.cache_turn else None
        self.backend.free(req.blocks)
        req.blocks = []
        req.done = True
        if ok:
            self.counts["completed"] += 1
            self.metrics.completed.inc()
        else:
            self.counts["failed"] += 1
        self.server.reply(
            req.envelope,
            {
                "op": "decoded",
                "req_id": req.req_id,
                "ok": ok,
                "tokens": req.tokens if ok else [],
                "error": error,
                "recomputed": req.recompute,
                **({"cache": cache} if cache is not None else {}),
            },
        )

    def stats(self) -> Msg:
        return {
            "role": "decode",
            "waiting": len(self.waiting),
            "running": len(self.running),
            "tracked": len(self.tracker),
            "blocks_free": self.backend.num_free,
            **self.counts,
            "oversized": self.gate.oversized,
            "unknown_sender": self.gate.unknown_sender,
            # names bound to addresses (adapters/nixl.py)
            "pushes_refused": self.backend.endpoint.stats.pushes_refused,
            "names_refetched": self.backend.endpoint.stats.names_refetched,
            "tracker": stats_dict(self.tracker.stats),
            **self.turns.stats(),
            **self.backend.auth_stats(),
        }

    # -- loop -----------------------------------------------------------------------------
    def step(self, wait_s: float | None = None) -> None:
        states = {r.state for r in self.running.values()}
        pending = bool(states & {"reading", "verifying"})
        if wait_s is None:  # short while a read or its verdict is outstanding
            wait_s = PENDING_WAIT_S if pending else IDLE_WAIT_S
        if wait_s > 0 and "decoding" not in states:
            # a read outstanding: its verdict (or our READ's progress) ends the wait
            wait_for_input(self.server.sock, wait_s, self.backend.endpoint if pending else None)
        while (got := self.server.recv()) is not None:
            self._request(*got)
        if self.server.bad:
            self._malformed(f"{self.server.bad} unparsable request-plane messages")
            self.server.bad = 0
        for rank, msg in self.followers.poll():
            self._from_follower(rank, msg)
        self.lease_step()
        self._reads_progress()
        self.schedule()
        self.compute()
        self.metrics.waiting.set(len(self.waiting))
        self.metrics.running.set(len(self.running))
        # forget P ids of answered requests once nothing can NACK them usefully
        if len(self.by_remote) > 4 * (len(self.waiting) + len(self.running)) + 1024:
            self.by_remote = {k: r for k, r in self.by_remote.items() if not r.done}

    def describe(self) -> str:
        o = self.opts
        return (
            f"decode rank 0/{o.tp} serving on {o.host}:{self.server.port} (NIXL "
            f"{self.backend.nixl_port}, agent {self.backend.agent_name}, policy "
            f"{o.policy}, max running {o.max_running})"
        )

    def close(self) -> None:
        self.followers.close()
        self.server.close()
        self.turns.close()
        self.backend.close()
        self.ctx.term()
