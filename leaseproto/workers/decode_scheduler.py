"""One request's path through decode rank 0, in one place:
:class:`DecodeScheduler` owns the requests (the waiting queue, the running
set, the index by P's id) and moves each through the parts of the worker
(:mod:`.decode`), which decide, count and keep their own state. One loop turn
is :meth:`DecodeScheduler.advance`.

1. **arrival** (:meth:`~DecodeScheduler.intake`): parsed and checked
   (``Req.from_msg``, the prompt, the cluster key), and refused with the
   reason (``output.refuse``) if that fails, if it contradicts a greeted P
   agent (``verification.contradiction``) or if P's lease settings do not fit
   ours (``leases.mismatch``). The first request naming a P engine starts the
   NIXL handshake with its ranks in the background (``leases.engine``, then
   ``followers.connect``); ``verification.decide`` settles whether its reads
   wait for verdicts. It joins the waiting queue and is heartbeated from now
   on (``leases.track``), not only once scheduled;
2. **heartbeats** (:meth:`~DecodeScheduler.lease_step`, every turn):
   ``leases.heartbeats`` sends what the tracker says is due to **every** P rank
   of each engine; an engine lost (a failed send, ``leases.peer_lost``) fails
   its requests over (:meth:`~DecodeScheduler._engines_lost`). What P says back
   goes through :meth:`~DecodeScheduler._notification`, what ranks 1.. say
   through :meth:`~DecodeScheduler.from_follower`;
3. **hello, then a READ per P rank** (:meth:`~DecodeScheduler.schedule`): a
   waiting request enters the bounded running set when blocks allow and
   :meth:`~DecodeScheduler._ready_to_read` says so: every P rank connected
   (``leases.connected``) and every P agent it verifies greeted
   (``verification.hellos`` sent ``HB:leaseproto/1``, ``verification.greeted``
   took the ``OK``; ``verification.ready``). ``reads.start`` posts a READ per P
   rank with its transfer-done, and ranks 1.. read theirs;
4. **verdicts** (:meth:`~DecodeScheduler.reads_progress`,
   :meth:`~DecodeScheduler._verdict`): once every READ is done and every shard
   is in (``reads.progress``, ``reads.shard``) heartbeats stop
   (``leases.untrack``) and the request waits for ``OK`` from every P agent it
   read (``reads.verdict``);
5. **use or recompute**: every ``OK`` in (or a P that gives no verdicts):
   ``reads.use``, decoding starts from P's first token. ``NK``, no verdict in
   time (``reads.overdue``), a NACK or ``LL`` (``leases.nack``,
   ``leases.lease_lost``), a failed READ or a lost P:
   :meth:`~DecodeScheduler._kv_lost` discards what was read and
   (``output.failover``) recomputes the prompt locally (``output.recompute``;
   ``on_kv_loss="recompute"``: same model, same tokens) or answers with a
   clear error (``"error"``); never an uncaught exception, never a hang;
6. **decode, turn cached, answer** (:meth:`~DecodeScheduler.compute`,
   :meth:`~DecodeScheduler._finish`; :mod:`.decode_output`): the model runs
   (``output.decode``); ``output.answer`` keeps a conversation's turn under a
   lease P can read for the next turn (``turns.keep``) and gives the router
   the tokens, ``recomputed`` and, for a turn, where it is cached.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque

from ..core import wire
from ..core.errors import LocalProtocolError
from . import verdicts
from .backend import KVBackend
from .decode_fanout import Followers
from .decode_leases import PLeases
from .decode_output import Output
from .decode_reads import PReads
from .decode_state import DecodeOptions, Engine, Reporting, Req
from .decode_turns import TurnGrants, for_grantor
from .decode_verification import Verification
from .keys import key_mismatch
from .notifications import NotificationGate
from .plane import Msg

__all__ = ["DecodeScheduler"]

log = logging.getLogger("leaseproto.decode")


class DecodeScheduler:
    """The requests of decode rank 0 and their path through its parts."""

    def __init__(
        self,
        opts: DecodeOptions,
        backend: KVBackend,
        out: Reporting,
        gate: NotificationGate,
        *,
        leases: PLeases,
        verification: Verification,
        reads: PReads,
        followers: Followers,
        turns: TurnGrants,
        output: Output,
    ) -> None:
        """The parts are the worker's."""
        self.opts = opts
        self.backend = backend
        self.out = out
        self.gate = gate
        self.leases = leases
        self.verification = verification
        self.reads = reads
        self.followers = followers
        self.turns = turns
        self.output = output
        self.waiting: deque[Req] = deque()
        self.running: dict[str, Req] = {}
        self.by_remote: dict[str, Req] = {}  # P's id -> request (for NACKs and verdicts)
        self._now = -math.inf

    def _clock(self) -> float:
        self._now = max(self._now, time.monotonic())
        return self._now

    def advance(self) -> None:
        """One loop turn after the request plane's intake: what ranks 1.. and
        P said, heartbeats, reads, scheduling, the model."""
        for rank, msg in self.followers.poll():
            self.from_follower(rank, msg)
        self.lease_step()
        self.reads_progress()
        self.schedule()
        self.compute()
        # forget P ids of answered requests once nothing can NACK them usefully
        if len(self.by_remote) > 4 * (len(self.waiting) + len(self.running)) + 1024:
            self.by_remote = {k: r for k, r in self.by_remote.items() if not r.done}

    # -- 1. arrival -----------------------------------------------------------------------
    def intake(self, envelope: list[bytes], msg: Msg) -> None:
        """A ``decode`` request: refused with the reason, failed over, or queued
        and heartbeated from now on."""
        try:
            req = Req.from_msg(envelope, msg, now=self._clock(), block_size=self.opts.block_size)
            problem = self.backend.check_prompt(req.prompt, req.max_tokens, req.first_token)
            if problem is None and self.backend.agent_name in {r.agent for r in req.ranks}:
                problem = "transfer parameters name this decode worker's own NIXL agent"
            if problem is not None:
                raise ValueError(problem)
        except ValueError as exc:
            self.out.malformed(str(exc))
            self.output.refuse(envelope, msg.get("req_id"), str(exc))
            return
        if req.req_id in self.running or any(r.req_id == req.req_id for r in self.waiting):
            self.output.refuse(envelope, req.req_id, "duplicate request id")
            return
        problem = key_mismatch(req.ranks, self.opts.cluster_key)
        if problem is not None:
            self.out.counts["failed"] += 1
            self.out.drops.drop("request of a P engine with another cluster key", problem)
            self.output.refuse(envelope, req.req_id, f"refused P engine {req.engine_id}: {problem}")
            return
        problem, gone = self.verification.contradiction(req, now=self._clock())
        for agent in gone:  # a restarted P's old agents
            self._engines_lost(
                self.leases.peer_lost(agent, "gone: a request names another agent for its rank")
            )
        if problem is not None:  # counted and logged there
            self.output.refuse(envelope, req.req_id, problem)
            return
        problem = self.leases.mismatch(req)
        if problem is not None and self.opts.lease_mismatch == "refuse":
            self.out.counts["failed"] += 1
            self.output.refuse(envelope, req.req_id, f"refused P engine {req.engine_id}: {problem}")
            return
        try:
            engine, new = self.leases.engine(req)
        except ValueError as exc:  # an address NIXL refuses: this request only
            self.out.malformed(f"transfer parameters of req {req.req_id}: {exc}")
            self._finish(req, ok=False, error=f"unusable transfer parameters: {exc}")
            return
        if new:
            self.followers.connect(req.ranks)
        self.verification.decide(req)
        self.waiting.append(req)
        self.by_remote[req.remote_req_id] = req
        if engine.lost:
            self._kv_lost(req, f"P engine {engine.engine_id} is gone ({engine.lost})")
            return
        try:
            self.leases.track(req, now=self._clock())
        except LocalProtocolError as exc:  # an id too long for our heartbeats
            self.out.malformed(f"req {req.req_id}: {exc}")
            self._finish(req, ok=False, error=str(exc))

    # -- 2. heartbeats, and what P and ranks 1.. say --------------------------------------
    def lease_step(self) -> None:
        """Lost P peers, due heartbeats and hellos; then what came in over NIXL:
        P's answers (here) and the acts for D's cached turns (``turns``)."""
        now = self._clock()
        for agent, reason in self.backend.take_lost_peers():
            self._engines_lost(self.leases.peer_lost(agent, reason))
        self._engines_lost(self.leases.heartbeats(now=now, by_remote=self.by_remote))
        self.verification.hellos(now=self._clock())
        mine: list[tuple[str, bytes]] = []  # what P says about its leases
        granted: list[tuple[str, bytes]] = []  # acts for D's cached turns
        for sender, payload in self.gate.admit(self.backend.poll()):
            (granted if for_grantor(payload) else mine).append((sender, payload))
        for sender, payload in mine:
            self._notification(sender, payload)
        if granted or self.turns.busy():  # D holds cached turns
            self.turns.grant_step(granted)
        self.out.drops.flush()

    def _notification(self, sender: str, payload: bytes) -> None:
        try:
            msg = wire.decode(payload)
        except wire.MalformedMessage as exc:
            self.out.malformed(f"notification from {sender}: {exc}")
            return
        if isinstance(msg, (wire.Ok, wire.Nack)):
            self._verdict(sender, msg)
        elif isinstance(msg, wire.LeaseLost):
            self._lease_lost(sender, msg.req_id, msg.reason)
        else:
            self.out.malformed(f"unexpected {type(msg).__name__} from {sender}")

    def _nack(self, remote_req_id: str, reason: str, sender: str) -> None:
        req = self.by_remote.get(remote_req_id)
        if self.leases.nack(req, remote_req_id, reason, sender) and req is not None:
            self._kv_lost(req, f"NACK: lease {reason} before the read")

    def _lease_lost(self, sender: str, remote_req_id: str, reason: str) -> None:
        req = self.by_remote.get(remote_req_id)
        if req is not None and self.verification.foreign(req, sender, "LL"):
            return
        if self.leases.lease_lost(req, remote_req_id, reason, sender) and req is not None:
            self._kv_lost(req, f"LL: lease {reason} before the read")

    def from_follower(self, rank: int, msg: Msg | None) -> None:
        """What rank ``rank`` said (None: its connection dropped): a shard, a
        failed read, or what a P agent told it."""
        if msg is None:
            log.error("decode rank %d disconnected: requests reading through it fail over", rank)
            for r in list(self.running.values()):
                if rank in r.followers_pending:
                    self._kv_lost(r, f"decode rank {rank} disconnected", abort=True)
            return
        op = msg.get("op")
        req = self.running.get(str(msg.get("req_id")))
        if op in ("read_done", "read_failed"):
            if req is not None and rank in req.followers_pending:
                problem = self.reads.shard(req, rank, msg)
                if problem is not None:
                    self._kv_lost(req, problem, abort=True)
        elif op in ("nack", "lease_lost"):  # from a P agent, through that rank
            remote, reason, agent = (str(msg.get(k)) for k in ("remote_req_id", "reason", "agent"))
            req = self.by_remote.get(remote)
            if req is not None and self.verification.foreign(
                req, agent, f"{op} via decode rank {rank}"
            ):
                return
            if op == "nack":
                self._nack(remote, reason, agent)
            else:
                self._lease_lost(agent, remote, reason)
        elif op == "peer_lost":
            self._engines_lost(self.leases.peer_lost(str(msg.get("agent")), str(msg.get("reason"))))

    def _engines_lost(self, engines: list[Engine]) -> None:
        """Fail over every request still waiting for the KV of a lost engine."""
        for engine in engines:
            for req in [*self.waiting, *self.running.values()]:
                if req.engine_id == engine.engine_id and req.needs_remote_kv and not req.kv_in:
                    self._kv_lost(req, f"P engine {engine.engine_id} lost: {engine.lost}")

    # -- 3. hello, then READ per rank -----------------------------------------------------
    def schedule(self) -> None:
        """Waiting requests into the running set, oldest first, while there is
        room and blocks: each reads P's KV, or recomputes it."""
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
                self.output.recompute(req)
            elif (problem := self.reads.start(req, now=self._clock())) is not None:
                self._kv_lost(req, problem, abort=True)

    def _ready_to_read(self, req: Req) -> bool:
        engine = self.leases.connected(req)
        if engine is None:
            return False
        ready = self.verification.ready(req, engine, now=self._clock())
        if isinstance(ready, str):  # an agent silent to our hello: give up on it
            self._kv_lost(req, ready, abort=True)
            return False
        return ready

    # -- 4. verdicts ----------------------------------------------------------------------
    def reads_progress(self) -> None:
        """Each running request's READs and verdicts: failed, done, overdue."""
        now = self._clock()
        for req in list(self.running.values()):
            if req.state == "verifying":
                if req.verdicts_due and now >= req.verify_by:
                    self._kv_lost(req, self.reads.overdue(req))
            elif req.state == "reading":
                problem = self.reads.progress(req, now=now)
                if problem is not None:
                    self._kv_lost(req, problem, abort=True)
                elif req.state == "verifying":  # every READ done: stop heartbeating
                    self.leases.untrack(req.req_id)
                    self._maybe_use(req)

    def _verdict(self, sender: str, msg: wire.Ok | wire.Nack) -> None:
        """A verdict for one of our transfer-dones (rank 0's own reads), or the
        answer to our hello."""
        if isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
            self.verification.greeted(sender)
            return
        req = self.by_remote.get(msg.req_id)
        if req is not None and self.verification.foreign(req, sender, type(msg).__name__):
            return
        act = self.reads.verdict(req, sender, msg)
        if req is None or act == verdicts.IGNORE:
            if isinstance(msg, wire.Nack):
                self._nack(msg.req_id, msg.reason, sender)  # logged and counted there
        elif act == verdicts.DISCARD and isinstance(msg, wire.Nack):
            self._kv_lost(req, f"NK: lease {msg.reason} before the read was confirmed")
        else:
            self._maybe_use(req)  # an OK: used once every verdict is in

    # -- 5. use or recompute --------------------------------------------------------------
    def _maybe_use(self, req: Req) -> None:
        """Decode from what was read once every verdict is OK (at once when
        the engine gives none)."""
        if req.state == "verifying" and not req.verdicts_due:
            self.reads.use(req, now=self._clock())

    def _kv_lost(self, req: Req, reason: str, *, abort: bool = False) -> None:
        """P's KV for ``req`` is unusable: recompute locally or fail. ``abort``:
        P may still hold it (a failed read, not a lost P or a NACK), so tell P
        to free it now rather than at expiry (``AB:``, best effort)."""
        if req.done or not req.needs_remote_kv:
            return  # already failed over (several P ranks may report the same loss)
        self._drop_remote(req, abort=abort)
        error = self.output.failover(req, reason)
        if error is not None:
            self._finish(req, ok=False, error=error)
        elif req.req_id in self.running and req.blocks:
            self.output.recompute(req)

    def _drop_remote(self, req: Req, *, abort: bool) -> None:
        """Stop heartbeating and reading ``req``'s KV at P (``abort``: tell P)."""
        self.leases.untrack(req.req_id)
        if abort:
            self.leases.abort(req)
        self.reads.drop(req)

    def abort(self, req_id: object) -> None:
        """The router gave up on ``req_id``: drop it, and free P's blocks now."""
        req = next((r for r in [*self.waiting, *self.running.values()] if r.req_id == req_id), None)
        if req is None:
            return
        log.info("req %s aborted by the router", req.req_id)
        if req.needs_remote_kv and not req.kv_in:
            self._drop_remote(req, abort=True)
        self._finish(req, ok=False, error="aborted by the router")

    # -- 6. decode, turn cached, answer ---------------------------------------------------
    def compute(self) -> None:
        """One decode step of the running set (``output.decode``); each
        request done is answered."""
        for req, error in self.output.decode(self.running.values()):
            self._finish(req, ok=error is None, error=error)

    def _finish(self, req: Req, *, ok: bool, error: str | None = None) -> None:
        """``req`` leaves: no more heartbeats, out of the queues, answered."""
        self.leases.untrack(req.req_id)
        if req.req_id in self.running:
            del self.running[req.req_id]
        elif req in self.waiting:
            self.waiting.remove(req)
        self.output.answer(req, ok=ok, error=error)
