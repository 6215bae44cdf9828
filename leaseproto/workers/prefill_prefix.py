"""P as a reader: a turn-2 request's prefix, read from D's cached turn and used
only after D's verdict (I14), with P heartbeating D while it waits (I16).

A ``prefill`` request of a conversation's later turn names D's cached lease
(:class:`~.messages.TransferParams`: D's lease id, engine, ranks, and the time
left as a duration the router aged). From queue entry P heartbeats D for it
(``HB:<D's id>``, batched per D engine, every ``heartbeat_interval``: the
core's :class:`~leaseproto.core.tracker.HeartbeatTracker`, the same mechanism
D uses towards P) and greets D's agents with ``HB:leaseproto/1`` (D answers
``OK:leaseproto/1`` and from then on answers P's transfer-dones with
verdicts). When the request reaches the head of P's queue:

1. **gate** (I9, :class:`~leaseproto.core.clock.ClockOffset`): the duration is
   anchored at P's receipt, its uncertainty grows with age (drift); a read
   that could not finish ``safety_margin`` before the deadline is skipped;
2. **read**: every head of the prefix's blocks from D into P's staging pool
   (each P rank computes every head, :mod:`leaseproto.toymodel`), the
   transfer-done ``<D's id>:<P tp>`` attached; heartbeats stop when it is done;
3. **fence** (I14): the prefix is used only after ``OK`` from every D agent
   read. ``NK``, an ``LL`` before the read, a failed READ, no verdict within
   ``verdict_wait``, or the gate → the prefix is recomputed (counted by
   reason, logged rate-limited, trace ``recompute``) and P prefills the whole
   prompt; a prefix given up on before D answered is aborted on D (``AB:``).

``gate_only`` (``serve prefill --turn-reads gate-only``, for comparison) is what
vLLM 0.32 does in bidirectional mode: no heartbeats and no hello, so D holds
the turn for its fixed TTL and gives no verdict; P checks only the time gate
(``now + safety_margin < deadline``, no uncertainty) and uses whatever its READ
returned (trace ``use`` with no ``ok_from``; the trace header says
``verify_reads: false``). A read that completes after D freed and reused the
blocks is used all the same (B4; ``leaseproto check-trace`` reports it as I14).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..adapters.kv_pool import LayoutError, PoolExhausted
from ..adapters.xfer import Transfer
from ..core import rules as R
from ..core import wire
from ..core.clock import ClockOffset
from ..core.config import LeaseConfig
from ..core.errors import LocalProtocolError
from ..core.tracker import HeartbeatTracker
from .decode_state import hello, verdict_wait
from .messages import RankParams, TransferParams
from .metrics import PrefillMetrics
from .notifications import DropLog

if TYPE_CHECKING:
    from .backend import KVBackend

__all__ = ["Prefix", "PrefixReads"]

log = logging.getLogger("leaseproto.prefill.prefix")

#: Why a prefix was recomputed (the trace's ``recompute`` reasons).
REASONS = ("nack", "timeout", "lost", "gate")


@dataclass(eq=False)
class Prefix:
    """One turn-2 request's prefix, from P's queue entry to its use."""

    req_id: str
    lease_id: str
    engine_id: str
    ranks: list[RankParams]
    num_tokens: int
    #: local estimate of D's cached lease deadline: the duration anchored at
    #: receipt, moved to ``sent + lease_extension`` by each heartbeat P sends (the
    #: gate's optimistic view: a heartbeat D never handled ends in NK, not in use)
    deadline: float
    gate: ClockOffset
    #: what a heartbeat extends D's lease to (D's advertised ``lease_extension``)
    extension: float = 0.0
    #: when it entered P's queue (P's clock)
    since: float = 0.0
    #: ``waiting`` -> ``reading`` -> ``verifying`` -> ``ok`` | ``lost``
    state: str = "waiting"
    #: the gate admitted the read (it is not asked again)
    admitted: bool = False
    #: the injected stalls hit this read; its READ is posted no earlier than ``resume_at``
    stalled: bool = False
    resume_at: float = 0.0
    reason: str = ""
    staging: list[int] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    verdicts_due: set[str] = field(default_factory=set)
    ok_from: list[str] = field(default_factory=list)
    verify_by: float = 0.0

    @property
    def agents(self) -> list[str]:
        return [r.agent for r in self.ranks]

    @property
    def settled(self) -> bool:
        return self.state in ("ok", "lost")


class PrefixReads:
    """The prefixes of one P rank's queued turn-2 requests."""

    def __init__(
        self,
        backend: KVBackend,
        config: LeaseConfig,
        *,
        p_tp: int,
        notes: DropLog,
        metrics: PrefillMetrics | None = None,
        stall: float = 0.0,
        gate_only: bool = False,
        stall_at_gate: float = 0.0,
        stalls: int | None = None,
    ) -> None:
        """``gate_only``: read as vLLM 0.32 does (see the module's docstring).
        Fault injection: ``stall``, the loop sleeps this long after posting a
        prefix READ (P paused past D's deadline after the gate admitted it);
        ``stall_at_gate``, once the gate admits a read P stops working on it for
        this long (no heartbeat for it, READ not posted, its queue waits behind
        it) while the rest of its loop goes on, as vLLM's NIXL progress thread
        does through a long engine step; ``stalls``: how many reads the stalls
        hit, the first ones admitted (None: every one)."""
        self.backend = backend
        self.metrics = metrics
        self.stall = stall
        self.gate_only = gate_only
        self.stall_at_gate = stall_at_gate
        self.stalls_left = stalls
        self.config = config
        self.p_tp = p_tp
        self.notes = notes
        self.tracker = HeartbeatTracker(config)
        self.by_req: dict[str, Prefix] = {}
        self.by_lease: dict[str, Prefix] = {}
        self.engines: dict[str, list[str]] = {}  # D engine -> its agents
        #: D agents that answered our hello (they give verdicts)
        self.greeted: set[str] = set()
        self._hello_at: dict[str, float] = {}
        self.counts = {"prefix_verified": 0, "prefix_heartbeats_sent": 0, "prefix_foreign": 0}
        self.counts["prefix_unverified"] = 0  # used without a verdict (gate_only)
        self.counts.update({f"prefix_recomputed_{r}": 0 for r in REASONS})

    def __len__(self) -> int:
        return len(self.by_req)

    def get(self, req_id: str) -> Prefix | None:
        return self.by_req.get(req_id)

    def agents_in_use(self) -> set[str]:
        """The D agents of every prefix P still works on (from queue entry to
        :meth:`done`): P must not forget them while it reads, or awaits their
        verdicts."""
        return {r.agent for p in self.by_req.values() for r in p.ranks}

    # -- queue entry ----------------------------------------------------------------------
    def track(self, req_id: str, params: TransferParams, cached: int, *, now: float) -> None:
        """Start on ``req_id``'s prefix. Raises ``ValueError`` for parameters
        that cannot describe one (the request is refused)."""
        if not cached > 0 or not params.ranks:
            raise ValueError(f"a prefix of {cached} tokens cannot be read")
        wire.check_id(params.remote_req_id)
        left = min(r.lease_remaining for r in params.ranks)
        leases = [r.lease for r in params.ranks]
        extension = min(
            [self.config.lease_extension, *(x.lease_extension for x in leases if x is not None)]
        )
        gate = ClockOffset()
        gate.add_sample(t0=now, remote_time=now, t1=now)  # a duration: our own clock
        p = Prefix(
            req_id,
            params.remote_req_id,
            params.engine_id,
            list(params.ranks),
            cached,
            now + left,
            gate,
            extension=extension,
            since=now,
        )
        try:  # gate_only: nobody renews D's lease (vLLM's fixed TTL)
            if not self.gate_only:
                self.tracker.track(req_id, engine_id=p.engine_id, remote_req_id=p.lease_id, now=now)
        except LocalProtocolError as exc:
            raise ValueError(str(exc)) from exc
        for r in p.ranks:  # ValueError: NIXL refuses the address
            if not self.backend.is_connected(r.agent):
                self.backend.connect(r.agent, r.host, r.nixl_port, keyed=r.key_id is not None)
        self.engines[p.engine_id] = p.agents
        self.by_req[req_id] = p
        self.by_lease[p.lease_id] = p

    # -- each loop turn -------------------------------------------------------------------
    def step(self, *, now: float) -> None:
        due = self.tracker.due(now=now, pending=self._pending())
        room = self.config.max_notification_bytes - self.backend.frame_overhead
        for engine_id, ids in due.items():
            for lease_id in ids:
                p = self.by_lease.get(lease_id)
                if p is not None:
                    p.deadline = max(p.deadline, now + p.extension)
            for agent in self.engines.get(engine_id, []):
                for payload in self.tracker.payloads(ids, max_bytes=room):
                    if not self.backend.send(agent, payload):
                        self._engine_lost(engine_id, f"heartbeat to {agent} could not be sent")
                        break
                    self.counts["prefix_heartbeats_sent"] += 1
                    if self.metrics is not None:
                        self.metrics.prefix_heartbeats.inc()
        for p in list(self.by_req.values()):
            for agent in [] if self.gate_only else p.agents:  # greet until it answers (every H)
                last = self._hello_at.get(agent, -math.inf)
                if agent in self.greeted or now - last < self.config.heartbeat_interval:
                    continue
                if self.backend.ready(agent):
                    self._hello_at[agent] = now
                    self.backend.send(agent, hello())
            if p.state == "reading":
                self._progress(p, now)
            elif p.state == "verifying" and p.verdicts_due and now >= p.verify_by:
                self.lose(p, "timeout", f"no verdict within {verdict_wait(self.config):g} s")

    def _engine_lost(self, engine_id: str, why: str) -> None:
        for p in list(self.by_req.values()):
            if p.engine_id == engine_id and p.state == "waiting":
                self.lose(p, "lost", why)

    def _pending(self) -> set[str]:
        return {
            e
            for e, agents in self.engines.items()
            if not all(self.backend.ready(a) for a in agents)
        }

    def start(self, p: Prefix, *, now: float) -> None:
        """At the head of P's queue: gate, then the READ (or wait for the
        handshake / staging blocks)."""
        if p.state != "waiting":
            return
        if not p.admitted and not self._admit(p, now):
            return
        if now < p.resume_at:
            return  # an injected stall after the gate
        try:
            p.staging = self.backend.staging.allocate(
                self.backend.staging.blocks_needed(p.num_tokens)
            )
        except PoolExhausted:
            return
        try:
            plan = self.backend.read_plan(p.ranks, p.staging, p.num_tokens, into="staging")
        except (LayoutError, ValueError) as exc:
            self.lose(p, "lost", f"unusable prefix parameters: {exc}")
            return
        notif = wire.encode_transfer_done(p.lease_id, self.p_tp)
        for rank, local, remote in plan:
            p.transfers.append(self.backend.read(rank.agent, local, remote, notif_msg=notif))
            if not self.gate_only:
                p.verdicts_due.add(rank.agent)
        p.ok_from = sorted(p.verdicts_due)
        p.state = "reading"
        if self.stall > 0 and p.stalled:
            log.warning(
                "req %s: stalling %g s after the prefix READ (injected)", p.req_id, self.stall
            )
            time.sleep(self.stall)

    def _admit(self, p: Prefix, now: float) -> bool:
        """The gate (I9) and D's greeting; whether the READ may go ahead."""
        margin = self.config.safety_margin
        if self.gate_only:  # vLLM's check: the deadline as known, no uncertainty
            allowed = R.read_allowed(p.deadline, now, 0.0, 0.0, margin)
        else:
            allowed = p.gate.read_allowed(p.deadline, now=now, margin=margin)
        if not allowed:
            self.lose(p, "gate", f"{p.deadline - now:.2f} s left, margin {margin:g} s")
            return False
        if not self.gate_only and not all(a in self.greeted for a in p.agents):
            wait = verdict_wait(self.config)
            if now - p.since > wait:  # D is gone or gives no verdicts: do not hold the queue
                self.lose(p, "lost", f"D's agents did not answer {wire.CAPABILITY} in {wait:g} s")
            return False
        p.admitted = True
        p.stalled = (self.stall > 0 or self.stall_at_gate > 0) and self._stall_hits()
        if self.stall_at_gate > 0 and p.stalled:
            p.resume_at = now + self.stall_at_gate
            self.tracker.untrack(p.req_id)  # P stops working on it: no heartbeat either
            self.backend.trace.emit(
                "stall", req=p.req_id, remote=p.lease_id, seconds=self.stall_at_gate
            )
            log.warning(
                "req %s: the gate admitted its prefix read (%.2f s left); stalling it %g s "
                "(injected)",
                p.req_id,
                p.deadline - now,
                self.stall_at_gate,
            )
        return True

    def _stall_hits(self) -> bool:
        """Whether the injected stalls hit the read admitted now (``stalls`` counts down)."""
        if self.stalls_left is None:
            return True
        if self.stalls_left <= 0:
            return False
        self.stalls_left -= 1
        return True

    def _progress(self, p: Prefix, now: float) -> None:
        states = [self.backend.transfer_state(x) for x in p.transfers]
        failed = [x for x in p.transfers if x.state == "ERR"]
        if failed:
            self.lose(p, "lost", f"READ from {failed[0].peer} failed: {failed[0].error}")
        elif all(s == "DONE" for s in states):
            self._release_transfers(p)
            self.tracker.untrack(p.req_id)  # read done: stop heartbeating
            p.state = "verifying"
            p.verify_by = now + verdict_wait(self.config)
            self._maybe_use(p)

    def _maybe_use(self, p: Prefix) -> None:
        if p.state != "verifying" or p.verdicts_due:
            return
        p.state = "ok"
        outcome = "unverified" if self.gate_only else "verified"
        self.counts[f"prefix_{outcome}"] += 1
        if self.metrics is not None:
            self.metrics.prefix_reads.labels(outcome=outcome).inc()
        self.backend.trace.emit(
            "use", req=p.req_id, kind="prefix", remote=p.lease_id, ok_from=p.ok_from
        )

    def _release_transfers(self, p: Prefix) -> None:
        for x in p.transfers:
            self.backend.release(x)
        p.transfers.clear()

    def lose(self, p: Prefix, reason: str, why: str) -> None:
        """Give up on ``p``'s prefix: it is recomputed (and D told, if it may
        still hold the blocks)."""
        if p.settled:
            return
        self._release_transfers(p)
        self.tracker.untrack(p.req_id)
        if reason != "nack" and not self.gate_only:  # D may hold it: let D free the blocks now
            for agent in p.agents:
                self.backend.send(agent, wire.encode_abort(p.lease_id))
        self._free_staging(p)
        p.state, p.reason = "lost", reason
        self.counts[f"prefix_recomputed_{reason}"] += 1
        if self.metrics is not None:
            self.metrics.prefix_reads.labels(outcome=reason).inc()
        self.backend.trace.emit("recompute", req=p.req_id, reason=reason, remote=p.lease_id)
        self.notes.drop("prefix recomputed", f"req {p.req_id} ({reason}): {why}")

    def _free_staging(self, p: Prefix) -> None:
        if p.staging:
            self.backend.staging.free(p.staging)
            p.staging = []

    def done(self, req_id: str) -> dict[str, Any] | None:
        """Forget ``req_id``'s prefix (prefilled, refused or aborted); what the
        reply says about it."""
        p = self.by_req.pop(req_id, None)
        if p is None:
            return None
        self.by_lease.pop(p.lease_id, None)
        if not p.settled:
            self.lose(p, "lost", "the request ended before its prefix was read")
        self._free_staging(p)
        verified = p.state == "ok" and not self.gate_only
        return {"tokens": p.num_tokens, "verified": verified, "recomputed": p.reason or None}

    # -- what D says ----------------------------------------------------------------------
    def verdict(self, sender: str, msg: wire.Message) -> bool:
        """Take an ``OK``/``NK``/``LL`` from a D agent; False if it is none of ours."""
        if isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
            if sender not in self._hello_at:
                return False
            self.greeted.add(sender)
            return True
        if not isinstance(msg, (wire.Ok, wire.Nack, wire.LeaseLost)):
            return False
        p = self.by_lease.get(msg.req_id)
        if p is None:
            return False
        if sender not in p.agents:
            self.counts["prefix_foreign"] += 1
            self.notes.drop("verdict from an agent the prefix is not read from", sender)
            return True
        if isinstance(msg, wire.Ok):
            if sender in p.verdicts_due and p.state in ("reading", "verifying"):
                p.verdicts_due.discard(sender)
                self._maybe_use(p)
        elif isinstance(msg, wire.Nack):
            if p.state in ("reading", "verifying"):
                self.lose(p, "nack", f"NK ({msg.reason}) from {sender}")
        elif p.state == "waiting":  # LL is advisory: only a request not reading yet gives up
            self.lose(p, "lost", f"LL ({msg.reason}) from {sender}")
        return True

    def stats(self) -> dict[str, Any]:
        return {"prefixes_waiting": len(self.by_req), **self.counts}
