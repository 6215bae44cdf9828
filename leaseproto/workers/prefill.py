"""A prefill rank: one process, one single-threaded engine loop.

Each turn of the loop (:meth:`PrefillWorker.step`):

1. **intake**: request-plane messages (``prefill``, ``abort``, ``stats``,
   ``ping``); a malformed one is counted and answered with an error, and a
   prompt that could never fit the pool is refused here;
2. **compute**: prefill queued prompts while the pool has blocks (this rank's
   share of the heads goes into its paged blocks), then ``LeaseTable.grant``
   (``consumers`` is only a default: the readers' transfer-dones carry their
   count), and answer the router with the transfer parameters (agent, NIXL
   address, block ids, layout, lease time left as a duration, and the
   capability ``leaseproto/1``);
3. **lease step** (:mod:`.prefill_leases`): NIXL notifications to the core,
   verdicts back to the readers (:mod:`.prefill_acts`), then ``expire``.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

import zmq

from ..core import wire
from ..core.peer import PARAMS_KEY, advertisement
from ..core.table import LeaseTable
from .backend import KVBackend
from .keys import curve
from .loop import IDLE_WAIT_S, PENDING_WAIT_S, EngineLoop, RankOptions, wait_for_input
from .messages import Abort, Prefill, parse
from .metrics import PrefillMetrics, stats_dict
from .notifications import DropLog, NotificationGate
from .plane import BadMessage, Msg, Server
from .prefill_leases import LeaseGrants
from .prefill_prefix import PrefixReads

__all__ = ["PrefillOptions", "PrefillWorker"]

log = logging.getLogger("leaseproto.prefill")

#: Most prompts prefilled in one loop turn.
_BATCH = 8
#: How P reads a turn-2 prefix from D (``--turn-reads``).
TURN_READS = ("verified", "gate-only")


@dataclass
class PrefillOptions(RankOptions):
    engine_id: str = "prefill-engine"
    #: turn-2 prefixes: ``verified`` (I14, I16) or ``gate-only`` (vLLM 0.32's
    #: bidirectional mode, for comparison: :mod:`.prefill_prefix`)
    turn_reads: str = "verified"
    #: fault injection: the loop stalls this long after posting a prefix READ
    prefix_stall: float = 0.0
    #: fault injection: a read the gate admitted waits this long (P stops on it)
    prefix_gate_stall: float = 0.0
    #: how many prefix reads the stalls hit, the first ones admitted (None: every one)
    prefix_stalls: int | None = None

    @property
    def verify_reads(self) -> bool:
        """Whether P uses a prefix only after D's verdict (the trace header says so)."""
        return self.turn_reads == "verified"

    def check(self) -> None:
        super().check()
        if self.turn_reads not in TURN_READS:
            raise ValueError(f"turn_reads must be one of {TURN_READS}, got {self.turn_reads!r}")


@dataclass
class _Queued:
    envelope: list[bytes]
    req_id: str
    prompt: list[int]
    consumers: int
    arrived: float
    #: the decode engine's agents the router named (the lease is bound to them)
    readers: tuple[str, ...] = ()


class PrefillWorker(EngineLoop):
    """One prefill rank (``rank`` of ``tp``) of engine ``engine_id``: its
    queue, and two parts that own their state: the leases it grants
    (``grants``, :class:`~.prefill_leases.LeaseGrants`) and its reads of D's
    cached turns (``prefixes``, :class:`~.prefill_prefix.PrefixReads`)."""

    opts: PrefillOptions

    def __init__(self, opts: PrefillOptions) -> None:
        opts.check()
        self.opts = opts
        self.agent_name = f"{opts.engine_id}-r{opts.rank}-{secrets.token_hex(3)}"
        self.backend = KVBackend(opts, agent_name=self.agent_name, role="prefill")
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.server = Server(self.ctx, opts.host, opts.port, curve=curve(opts.cluster_key))
        table = LeaseTable(opts.config)  # made first: the metrics read it from their start
        self.metrics = PrefillMetrics(opts.engine_id, opts.rank, table_stats=lambda: table.stats)
        if opts.metrics_port is not None:
            self.metrics.serve(opts.host, opts.metrics_port)
        self.queue: deque[_Queued] = deque()
        self.malformed = 0  # request-plane messages (the grants count notifications)
        drops = DropLog(log)
        self.notes = DropLog(log, prefix="")  # other lines a peer or client can trigger
        self.gate = NotificationGate(
            drops, max_bytes=opts.max_notification_in, known=self.backend.is_connected
        )
        #: P as a reader: turn-2 prefixes read from D's cached turns (I14, I16)
        self.prefixes = PrefixReads(
            self.backend,
            opts.config,
            p_tp=opts.tp,
            notes=self.notes,
            metrics=self.metrics,
            stall=opts.prefix_stall,
            gate_only=opts.turn_reads == "gate-only",
            stall_at_gate=opts.prefix_gate_stall,
            stalls=opts.prefix_stalls,
        )
        #: P as a grantor: its leases, and D's verdicts on its prefix reads handed over
        self.grants = LeaseGrants(
            opts,
            table,
            self.backend,
            self.metrics,
            self.gate,
            drops=drops,
            notes=self.notes,
            reader=self.prefixes.verdict,
            in_use=self.prefixes.agents_in_use,
        )
        self.metrics.blocks_free.set(self.backend.num_free)
        #: our lease settings, as durations, in every transfer parameter set (lease policy)
        # (with a cluster key, its id: D seals what it sends us and refuses us without it)
        key = {} if opts.cluster_key is None else {"auth": opts.cluster_key.key_id}
        self._advertised = (
            {PARAMS_KEY: {**advertisement(opts.config), **key}} if opts.policy == "lease" else {}
        )

    def ready_info(self) -> dict[str, Any]:
        return {
            "role": "prefill",
            "host": self.opts.host,
            "port": self.server.port,
            "metrics_port": self.metrics.port,
            "nixl_port": self.backend.nixl_port,
            "agent": self.agent_name,
            "rank": self.opts.rank,
            "tp": self.opts.tp,
        }

    def _clock(self) -> float:
        return self.grants.clock()

    # -- requests -------------------------------------------------------------------------
    def _request(self, envelope: list[bytes], msg: Msg) -> None:
        op = msg["op"]
        try:
            if op == "prefill":
                self._intake(envelope, parse(msg, Prefill))
            elif op == "abort":
                self._abort(parse(msg, Abort).req_id)
            elif not self.common_op(envelope, msg):
                raise BadMessage(f"unknown op {op!r}")
        except BadMessage as exc:
            self.malformed += 1
            self.metrics.malformed.inc()
            self.server.reply(
                envelope, {"op": "error", "req_id": msg.get("req_id"), "error": str(exc)}
            )

    def _intake(self, envelope: list[bytes], m: Prefill) -> None:
        """Queue a prefill. Raises :class:`BadMessage` for what its type cannot say."""
        try:
            wire.check_id(m.req_id)
        except ValueError as exc:
            raise BadMessage(f"bad req_id: {exc}") from exc
        if m.req_id in self.grants.table or any(q.req_id == m.req_id for q in self.queue):
            raise BadMessage(f"req {m.req_id} is already being served")
        problem = self.backend.check_prompt(m.prompt)
        if problem is not None:
            raise BadMessage(problem)
        # each P rank is read by every D rank that holds some of its heads
        consumers = max(1, m.d_tp // self.opts.tp)
        readers = tuple(m.readers or ())
        if m.prefix is not None and m.cached and self.opts.policy == "lease":
            if m.cached >= len(m.prompt):
                raise BadMessage(f"a prefix of {m.cached} tokens leaves nothing to prefill")
            try:
                self.prefixes.track(m.req_id, m.prefix, m.cached, now=self._clock())
            except ValueError as exc:
                raise BadMessage(f"bad prefix: {exc}") from exc
        self.queue.append(_Queued(envelope, m.req_id, m.prompt, consumers, self._clock(), readers))

    def _abort(self, req_id: str) -> None:
        for q in [q for q in self.queue if q.req_id == req_id]:
            self.queue.remove(q)
        self.prefixes.done(req_id)
        now = self._clock()
        rel = self.grants.table.abort(req_id, now=now)
        self.backend.trace.emit("abort_req", now=now, req=req_id)
        if rel is not None:
            self.grants.release(rel)

    def compute(self) -> None:
        """Prefill queued prompts, oldest first, while blocks are free; at most
        :data:`_BATCH` per step, so the lease step is never far away (S_P)."""
        for _ in range(_BATCH):
            if not self.queue:
                return
            q = self.queue[0]
            prefix = self.prefixes.get(q.req_id)
            if prefix is not None and not prefix.settled:
                self.prefixes.start(prefix, now=self._clock())
                if not prefix.settled:
                    return  # its read of D, or D's verdict, is still to come
            blocks = self.backend.alloc_for(len(q.prompt))
            if blocks is None:
                return  # wait for leases to end
            self.queue.popleft()
            use = prefix is not None and prefix.state == "ok"
            try:
                first = self.backend.prefill(
                    q.prompt,
                    blocks,
                    staged=prefix.staging if prefix is not None and use else (),
                    cached=prefix.num_tokens if prefix is not None and use else 0,
                )
            except ValueError as exc:  # checked at intake; never let it stop the loop
                self.prefixes.done(q.req_id)
                self.backend.free(blocks)
                self.notes.drop("prefill failed", f"req {q.req_id}: {exc}", level=logging.ERROR)
                self.server.reply(
                    q.envelope,
                    {"op": "error", "req_id": q.req_id, "error": f"prefill failed: {exc}"},
                )
                continue
            used = self.prefixes.done(q.req_id)
            now = self._clock()
            rel = self.grants.grant(
                q.req_id, blocks, now=now, consumers=q.consumers, readers=q.readers
            )
            self.metrics.prefills.inc()
            deadline = self.grants.table.deadline(q.req_id)
            self.backend.trace.emit(
                "grant",
                now=now,
                req=q.req_id,
                consumers=q.consumers,
                blocks=len(blocks),
                lease=None if deadline is None else deadline - now,
                readers=list(q.readers),
            )
            if rel is not None:  # a staged abort / transfer-done completed it already
                self.grants.release(rel)
                self.server.reply(
                    q.envelope,
                    {
                        "op": "error",
                        "req_id": q.req_id,
                        "error": f"lease ended at its grant ({rel.reason.value})",
                    },
                )
                continue
            remaining = 0.0 if deadline is None else deadline - now
            log.info(
                "granted req %s a %.1f s lease on %d blocks (%d reader%s)",
                q.req_id,
                remaining,
                len(blocks),
                q.consumers,
                "" if q.consumers == 1 else "s",
            )
            self.server.reply(
                q.envelope,
                {
                    "op": "prefilled",
                    "req_id": q.req_id,
                    "engine_id": self.opts.engine_id,
                    "rank": self.opts.rank,
                    "tp": self.opts.tp,
                    "agent": self.agent_name,
                    "host": self.opts.host,
                    "nixl_port": self.backend.nixl_port,
                    "block_ids": blocks,
                    "num_tokens": len(q.prompt),
                    "first_token": first,
                    "layout": self.backend.layout(),
                    "lease_remaining": remaining,
                    "consumers": q.consumers,
                    **({"prefix": used} if used is not None else {}),
                    # leaseproto/1: our lease settings, and we answer with verdicts
                    **self._advertised,
                },
            )

    def pong(self) -> Msg:
        return {
            "role": "prefill",
            "engine_id": self.opts.engine_id,
            "rank": self.opts.rank,
            "tp": self.opts.tp,
            "limits": self.backend.limits(),
        }

    def stats(self) -> Msg:
        now = self._clock()
        g = self.grants
        return {
            "role": "prefill",
            "rank": self.opts.rank,
            "blocks_held": sum(len(b) for b in g.blocks.values()),
            "blocks_free": self.backend.num_free,
            "blocks_total": self.opts.num_blocks,
            "leases_live": len(g.table),
            "queued": len(self.queue),
            "since_last_release": (None if g.last_release_at is None else now - g.last_release_at),
            "nacks_sent": g.acts.nacks_sent,
            "verdicts_sent": dict(g.acts.verdicts_sent),
            "verdict_readers": len(g.acts.verdict_readers),
            "malformed": self.malformed + g.acts.malformed,
            "oversized": self.gate.oversized,
            "unknown_sender": self.gate.unknown_sender,
            "max_notification_in": self.gate.max_bytes,
            "inbox_pending": g.inbox.pending,
            "inbox_overflow": g.inbox.overflow,
            "heartbeats_received": g.acts.heartbeats_received,
            "acts_refused": dict(g.binding.refused),
            "agents_heard": len(g.binding.last_heard),
            "agents_forgotten": g.agents_forgotten,
            "table": stats_dict(g.table.stats),
            **self.prefixes.stats(),
            **self.backend.auth_stats(),
        }

    # -- loop -----------------------------------------------------------------------------
    def step(self, wait_s: float | None = None) -> None:
        """One engine-loop turn: intake, compute, lease step. ``wait_s``: the
        longest wait for request-plane traffic when there is nothing to do
        (default: short while a lease is live, see ``loop.PENDING_WAIT_S``)."""
        busy = len(self.grants.table) or len(self.prefixes)
        if wait_s is None:
            wait_s = PENDING_WAIT_S if busy else IDLE_WAIT_S
        if wait_s > 0 and not self.grants.inbox:
            # a live lease: a transfer-done may come any moment, and D waits for its OK
            wait_for_input(self.server.sock, wait_s, self.backend.endpoint if busy else None)
        while (got := self.server.recv()) is not None:
            self._request(*got)
        if self.server.bad:
            self.malformed += self.server.bad
            self.metrics.malformed.inc(self.server.bad)
            self.server.bad = 0
        self.compute()
        self.grants.lease_step()
        self.prefixes.step(now=self._clock())

    def describe(self) -> str:
        o = self.opts
        return (
            f"prefill rank {o.rank}/{o.tp} of {o.engine_id} serving on {o.host}:"
            f"{self.server.port} (NIXL {self.backend.nixl_port}, agent {self.agent_name}, "
            f"policy {o.policy})"
        )

    def close(self) -> None:
        self.server.close()
        self.backend.close()
        self.ctx.term()
