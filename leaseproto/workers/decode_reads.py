"""Decode rank 0's reads of P's KV, and their verdicts (verified reads, I13).

A request's READs start once every P rank of its engine is connected; each
READ carries the transfer-done notification (``<id>:<n>``, ``n`` = the D ranks
that read this P rank), which NIXL delivers after the READ completed. A P
that advertised ``leaseproto/1`` in its transfer parameters answers every
transfer-done with a verdict: ``OK`` (the lease was live when it handled the
notification, so the bytes read are the blocks it granted) or ``NK`` (it had
ended). D emits no token computed from P's KV until it holds ``OK`` from
every P rank it read from (ranks 1.. wait for their own verdicts before they
hand over their shard, :mod:`.decode_follower`). ``NK``, or no verdict within
:func:`verdict_wait` of the READ's completion, discards what was read: the
request is recomputed locally (or fails, ``on_kv_loss="error"``).

Before its first read from a P that advertised, D says it understands
verdicts (a heartbeat naming the capability token, ``HB:leaseproto/1``, which
a stock P ignores as an unknown id); P acknowledges with ``OK:leaseproto/1``,
and reads from that engine start after the acknowledgement (an agent silent
for :func:`verdict_wait` after its first hello is given up on: the requests
waiting for it are recomputed). Against a P that did not advertise, D uses
reads unverified, as stock vLLM does, and logs that once per engine.

Who may say what (spec §7.4, §10.2). Whether a request's reads wait for
verdicts is decided per request at intake (:mod:`.decode`): a message can
turn verification on, never off, so once a P agent greeted us every read
from it waits for its OK. A verdict or ``LL`` counts only from a P agent the
request reads from; from anyone else it is counted (``foreign_verdicts``),
logged at most once a second, and ignored.

An ``LL`` (P no longer holds a lease a heartbeat named) is advisory: a
request still waiting gives up early and recomputes; one whose READ has
started waits for its verdict, which always wins.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..adapters.kv_pool import LayoutError
from ..core import wire
from . import verdicts
from .decode_follower import Followers
from .decode_state import PAgent, Req, hello, verdict_wait
from .decode_view import DecodeView
from .plane import Msg

__all__ = ["DecodeReads"]

log = logging.getLogger("leaseproto.decode")


class DecodeReads(DecodeView):
    """Reads, their verdicts and the capability handshake, for the decode worker."""

    followers: Followers

    def _kv_lost(self, req: Req, reason: str, *, abort: bool = False) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:  # in DecodeLeases, after this class in the worker's MRO

        def _peer_lost(self, agent: str, reason: str) -> None: ...

        def _nack(self, remote_req_id: str, reason: str, sender: str) -> None: ...

    # -- the capability handshake ---------------------------------------------------------
    def _hellos(self) -> None:
        """Tell each connected P agent whose reads we verify that we understand
        verdicts, until it acknowledges (again every heartbeat interval)."""
        now = self._clock()
        for agent, known in self.verdict_agents.items():
            if known.greeted or not self.backend.is_connected(agent):
                continue
            if now - known.hello_last >= self.config.heartbeat_interval:
                self._hello(agent, known, now)

    def _hello(self, agent: str, known: PAgent, now: float) -> bool:
        known.hello_last = now
        if known.hello_first is None:
            known.hello_first = now
        return self.backend.send(agent, hello())

    def _decide(self, req: Req) -> None:
        """Whether ``req``'s reads wait for verdicts: yes if it advertised
        ``leaseproto/1``, or its engine or one of its agents is known to give
        verdicts. A request can turn verification on, never off."""
        req.verified = (
            self.opts.policy == "lease"
            and self.opts.verify_reads
            and (
                req.ranks[0].verdicts
                or req.engine_id in self.verdict_engines
                or any(r.agent in self.verdict_agents for r in req.ranks)
            )
        )
        if req.verified:
            self.verdict_engines.add(req.engine_id)
            for r in req.ranks:
                self.verdict_agents.setdefault(r.agent, PAgent.at(req.engine_id, r))

    def _contradiction(self, req: Req) -> str | None:
        """Why ``req`` is refused (counted and logged), or None."""
        problem = self._contradicts(req)
        if problem is not None:
            self.counts["contradicting_requests"] += 1
            self.drops.drop("decode message contradicting a greeted P engine", problem)
        return problem

    def _contradicts(self, req: Req) -> str | None:
        """Why ``req`` cannot be taken (spec §10.2): it places an agent that
        greeted us elsewhere (another engine, rank or address), or names
        another agent for a rank of an engine whose agent there greeted us and
        still answers (a forged ``decode`` message; a restarted P's old agent
        is probed, and once it is gone its new agents are taken)."""
        for r in req.ranks:
            known = self.verdict_agents.get(r.agent)
            if known is not None and known.greeted:
                problem = known.misplaced(req.engine_id, r)
                if problem is not None:
                    return f"refused: {problem} (it greeted {wire.CAPABILITY})"
        by_rank = {r.rank: r.agent for r in req.ranks}
        now = self._clock()
        for agent, known in list(self.verdict_agents.items()):
            if not known.greeted or known.engine_id != req.engine_id:
                continue
            if by_rank.get(known.rank) == agent and len(req.ranks) == known.tp:
                continue
            lost = not self.backend.is_connected(agent) or (
                now - known.hello_last >= self.config.heartbeat_interval
                and not self._hello(agent, known, now)
            )
            if not lost:
                return (
                    f"refused: rank {known.rank}/{known.tp} of P engine {req.engine_id} is "
                    f"agent {agent}, which greeted {wire.CAPABILITY} and still answers; "
                    f"this request names {by_rank.get(known.rank)} of {len(req.ranks)} ranks"
                )
            # a restarted P: its new agents replace this one, whose reads stay verified
            known.greeted, known.hello_first = False, None
            self._peer_lost(agent, "gone: a request names another agent for its rank")
        return None

    def _ready_to_read(self, req: Req) -> bool:
        engine = self.engines.get(req.engine_id)
        agents = [r.agent for r in req.ranks]
        if engine is None or not all(self.backend.is_connected(a) for a in agents):
            return False
        if not req.verified:
            if not engine.unverified_logged:
                engine.unverified_logged = True
                self.notes.drop(
                    "unverified reads",
                    f"P engine {engine.engine_id} did not advertise {wire.CAPABILITY}: its "
                    "reads are used unverified (stock vLLM behaviour; a read of freed "
                    "blocks would go unnoticed)",
                )
            return True
        # (every agent of a verified request is in verdict_agents: _decide)
        known = [(r.agent, self.verdict_agents.get(r.agent)) for r in req.ranks]
        silent = [(a, k) for a, k in known if k is None or not k.greeted]
        if not silent:
            return True
        now, wait = self._clock(), verdict_wait(self.config)
        late = [
            a
            for a, k in silent
            if k is not None and k.hello_first is not None and now - k.hello_first > wait
        ]
        if late:
            self.counts["handshake_timeouts"] += 1
            agent = late[0]
            self.drops.drop(
                "P agent silent to our hello",
                f"{agent} did not answer {wire.CAPABILITY} within {wait:g} s",
            )
            self._kv_lost(req, f"P agent {agent} did not answer {wire.CAPABILITY}", abort=True)
        return False

    # -- reads ----------------------------------------------------------------------------
    def _start_reads(self, req: Req) -> None:
        req.state = "reading"
        req.read_started = self._clock()
        # vLLM's n: how many D ranks notify each P rank (the lease's readers)
        notif = wire.encode_transfer_done(
            req.remote_req_id, verdicts.readers_per_p_rank(self.opts.tp, len(req.ranks))
        )
        try:
            plan = self.backend.read_plan(req.ranks, req.blocks, req.num_tokens)
        except (LayoutError, ValueError) as exc:
            self._malformed(f"transfer parameters of req {req.req_id}: {exc}")
            self._kv_lost(req, f"unusable transfer parameters: {exc}", abort=True)
            return
        for rank, local, remote in plan:
            req.transfers.append(self.backend.read(rank.agent, local, remote, notif_msg=notif))
            if req.verified:
                req.verdicts_due.add(rank.agent)
        req.ok_from = sorted(req.verdicts_due)
        req.followers_pending.update(self.followers.ranks)
        refused = self.followers.read(req)
        if refused is not None:
            self._kv_lost(req, f"decode rank {refused} is not taking requests", abort=True)

    def _reads_progress(self) -> None:
        now = self._clock()
        for req in list(self.running.values()):
            if req.state == "verifying":
                if req.verdicts_due and now >= req.verify_by:
                    self._verdict_missing(req, now)
                continue
            if req.state != "reading":
                continue
            states = [self.backend.transfer_state(x) for x in req.transfers]
            failed = [x for x in req.transfers if x.state == "ERR"]
            if failed:
                self.metrics.transfers.labels(outcome="failed").inc()
                self._kv_lost(
                    req, f"READ from {failed[0].peer} failed: {failed[0].error}", abort=True
                )
                continue
            if all(s == "DONE" for s in states) and not req.followers_pending:
                for x in req.transfers:
                    self.backend.release(x)
                req.transfers.clear()
                self.tracker.untrack(req.req_id)  # transfer done: stop heartbeating
                self.metrics.transfers.labels(outcome="done").inc()
                self.metrics.transfer_time.observe(now - req.read_started)
                req.read_done_at = now
                req.verify_by = now + verdict_wait(self.config)
                req.state = "verifying"
                self._maybe_use(req)

    def _maybe_use(self, req: Req) -> None:
        """Decode from what was read once every verdict is OK (at once when
        the engine gives none)."""
        if req.state != "verifying" or req.verdicts_due:
            return
        if req.verified:
            self.counts["verified_reads"] += 1
            self.metrics.verdicts.labels(verdict="ok").inc()
            waited = max(0.0, self._clock() - req.read_done_at)
            self.metrics.verdict_wait.observe(waited)
            self.counts["verdict_wait_us"] += round(waited * 1e6)
        else:
            self.counts["unverified_reads"] += 1
            self.metrics.verdicts.labels(verdict="unverified").inc()
        self.backend.trace.emit(
            "use", req=req.req_id, remote=req.remote_req_id, ok_from=req.ok_from
        )
        req.start_token = req.first_token
        req.kv_in = True
        req.state = "decoding"

    def _verdict_missing(self, req: Req, now: float) -> None:
        wait = verdict_wait(self.config)
        self.counts["verdict_timeouts"] += 1
        self.metrics.verdicts.labels(verdict="timeout").inc()
        self.notes.drop(
            "no verdict",
            f"req {req.req_id}: none from {', '.join(sorted(req.verdicts_due))} within "
            f"{wait:.2f} s of its READ: discarding what was read",
        )
        self._kv_lost(req, f"no verdict within {wait:g} s of the READ")

    # -- what P says ----------------------------------------------------------------------
    def _foreign(self, req: Req, agent: str, what: str) -> bool:
        """Whether ``agent`` is none of the P agents ``req`` reads from, so
        what it said about ``req`` does not count (counted, logged at most
        once a second)."""
        if any(r.agent == agent for r in req.ranks):
            return False
        self.counts["foreign_verdicts"] += 1
        self.drops.drop(
            "verdict from an agent the request does not read from",
            f"{what} for req {req.req_id} from {agent}",
        )
        return True

    def _verdict(self, sender: str, msg: wire.Ok | wire.Nack) -> None:
        """A verdict for one of our transfer-dones (rank 0's own reads)."""
        if isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
            # the handshake's acknowledgement, from an agent we sent a hello
            known = self.verdict_agents.get(sender)
            if known is not None and known.hello_first is not None:
                known.greeted = True
            else:
                self.counts["foreign_verdicts"] += 1
                self.drops.drop("unasked capability answer", f"from {sender}")
            return
        req = self.by_remote.get(msg.req_id)
        if req is not None and self._foreign(req, sender, type(msg).__name__):
            return
        act = verdicts.IGNORE
        if req is not None and not req.done:
            act = verdicts.take_verdict(req.verdicts_due, sender, ok=isinstance(msg, wire.Ok))
        if req is None or act == verdicts.IGNORE:
            if isinstance(msg, wire.Nack):
                self._nack(msg.req_id, msg.reason, sender)  # logged and counted there
            return
        if act != verdicts.DISCARD or not isinstance(msg, wire.Nack):
            self._maybe_use(req)  # an OK: used once every verdict is in
            return
        self.counts["verdicts_nk"] += 1
        self.counts["nacks"] += 1
        self.metrics.nacks.inc()
        self.metrics.verdicts.labels(verdict="nk").inc()
        self.notes.drop(
            "NK",
            f"({msg.reason}) from {sender} for req {req.req_id}: its lease had ended when P "
            "handled the transfer-done; discarding what was read",
        )
        self._kv_lost(req, f"NK: lease {msg.reason} before the read was confirmed")

    def _lease_lost(self, sender: str, remote_req_id: str, reason: str) -> None:
        """Advisory: P no longer holds a lease a heartbeat named. A request that
        has not started reading gives up early; one reading waits for its
        verdict."""
        req = self.by_remote.get(remote_req_id)
        if req is not None and self._foreign(req, sender, "LL"):
            return
        self.counts["lease_lost"] += 1
        self.counts["nacks"] += 1
        self.metrics.nacks.inc()
        if (
            req is None
            or req.done
            or not req.needs_remote_kv
            or not verdicts.lease_lost_gives_up(reading=req.state != "waiting")
        ):
            log.debug("LL (%s) from %s for req %s: ignored", reason, sender, remote_req_id)
            return
        self.notes.drop(
            "LL",
            f"from {sender}: P no longer holds the lease of req {req.req_id} ({reason}); "
            "recomputing before any read",
        )
        self._kv_lost(req, f"LL: lease {reason} before the read")

    def _from_follower(self, rank: int, msg: Msg | None) -> None:
        if msg is None:
            log.error("decode rank %d disconnected: requests reading through it fail over", rank)
            for r in list(self.running.values()):
                if rank in r.followers_pending:
                    self._kv_lost(r, f"decode rank {rank} disconnected", abort=True)
            return
        op = msg.get("op")
        req = self.running.get(str(msg.get("req_id")))
        if op == "read_done" and req is not None and rank in req.followers_pending:
            try:
                kv = msg.get("kv")
                if not isinstance(kv, bytes):
                    raise ValueError("no KV bytes in the answer")
                self.backend.import_shard(rank, self.opts.tp, req.blocks, req.num_tokens, kv)
            except ValueError as exc:
                self._kv_lost(req, f"decode rank {rank} sent a bad shard: {exc}", abort=True)
                return
            req.followers_pending.discard(rank)
        elif op == "read_failed" and req is not None and rank in req.followers_pending:
            self.metrics.transfers.labels(outcome="failed").inc()
            self._kv_lost(req, f"decode rank {rank}: {msg.get('error')}", abort=True)
        elif op in ("nack", "lease_lost"):  # from a P agent, through that rank
            remote, reason, agent = (str(msg.get(k)) for k in ("remote_req_id", "reason", "agent"))
            req = self.by_remote.get(remote)
            if req is not None and self._foreign(req, agent, f"{op} via decode rank {rank}"):
                return
            if op == "nack":
                self._nack(remote, reason, agent)
            else:
                self._lease_lost(agent, remote, reason)
        elif op == "peer_lost":
            self._peer_lost(str(msg.get("agent")), str(msg.get("reason")))
