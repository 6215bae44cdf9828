"""Which P agents decode rank 0 verifies, the capability handshake with them,
and who may say what (verified reads, spec §7.4, §10.2): :class:`Verification`,
a part of :class:`~leaseproto.workers.decode.DecodeWorker` that owns this state.

A P that advertised ``leaseproto/1`` in its transfer parameters answers every
transfer-done with a verdict. Before its first read from such a P, D says it
understands verdicts (a heartbeat naming the capability token,
``HB:leaseproto/1``, which a stock P ignores as an unknown id); P acknowledges
with ``OK:leaseproto/1``, and reads from that engine start after the
acknowledgement (an agent silent for :func:`~.decode_state.verdict_wait` after
the first hello is given up on: the requests waiting for it are recomputed).
Against a P that did not advertise, D uses reads unverified, as stock vLLM
does, and logs that once per engine.

Whether a request's reads wait for verdicts is decided per request at intake
(:meth:`Verification.decide`): a message can turn verification on, never off,
so once a P agent greeted us every read from it waits for its OK, and a
``decode`` message that places a greeted agent elsewhere is refused
(:meth:`Verification.contradiction`). A verdict or ``LL`` counts only from a
P agent the request reads from (:meth:`Verification.foreign`).
"""

from __future__ import annotations

from ..core import wire
from .backend import KVBackend
from .decode_state import DecodeOptions, Engine, PAgent, Reporting, Req, hello, verdict_wait

__all__ = ["Verification"]


class Verification:
    """The P agents and engines whose reads decode rank 0 verifies (kept for its
    lifetime: no message turns verification off), and their handshake."""

    def __init__(self, opts: DecodeOptions, backend: KVBackend, out: Reporting) -> None:
        self.opts = opts
        self.config = opts.config
        self.backend = backend
        self.out = out
        #: P agents whose reads D verifies, and engines it was told give verdicts:
        #: a request-plane message can add to them, never remove (spec §7.4)
        self.agents: dict[str, PAgent] = {}
        self.engines: set[str] = set()

    def decide(self, req: Req) -> None:
        """Whether ``req``'s reads wait for verdicts: yes if it advertised
        ``leaseproto/1``, or its engine or one of its agents is known to give
        verdicts. A request can turn verification on, never off."""
        req.verified = (
            self.opts.policy == "lease"
            and self.opts.verify_reads
            and (
                req.ranks[0].verdicts
                or req.engine_id in self.engines
                or any(r.agent in self.agents for r in req.ranks)
            )
        )
        if req.verified:
            self.engines.add(req.engine_id)
            for r in req.ranks:
                self.agents.setdefault(r.agent, PAgent.at(req.engine_id, r))

    # -- who may say what -----------------------------------------------------------------
    def contradiction(self, req: Req, *, now: float) -> tuple[str | None, list[str]]:
        """Why ``req`` is refused (counted and logged), or None; and the agents
        of a restarted P it shows are gone (the worker drops them as lost peers).

        Refused (spec §10.2): ``req`` places an agent that greeted us elsewhere
        (another engine, rank or address), or names another agent for a rank
        of an engine whose agent there greeted us and still answers (a forged
        ``decode`` message). A restarted P's old agent is probed, and once it is
        gone its new agents are taken."""
        gone: list[str] = []
        problem = self._contradicts(req, now, gone)
        if problem is not None:
            self.out.counts["contradicting_requests"] += 1
            self.out.drops.drop("decode message contradicting a greeted P engine", problem)
        return problem, gone

    def _contradicts(self, req: Req, now: float, gone: list[str]) -> str | None:
        for r in req.ranks:
            known = self.agents.get(r.agent)
            if known is not None and known.greeted:
                problem = known.misplaced(req.engine_id, r)
                if problem is not None:
                    return f"refused: {problem} (it greeted {wire.CAPABILITY})"
        by_rank = {r.rank: r.agent for r in req.ranks}
        for agent, known in list(self.agents.items()):
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
            gone.append(agent)
        return None

    def foreign(self, req: Req, agent: str, what: str) -> bool:
        """Whether ``agent`` is none of the P agents ``req`` reads from, so
        what it said about ``req`` does not count (counted, logged at most
        once a second)."""
        if any(r.agent == agent for r in req.ranks):
            return False
        self.out.counts["foreign_verdicts"] += 1
        self.out.drops.drop(
            "verdict from an agent the request does not read from",
            f"{what} for req {req.req_id} from {agent}",
        )
        return True

    # -- the capability handshake ---------------------------------------------------------
    def hellos(self, *, now: float) -> None:
        """Tell each connected P agent whose reads we verify that we understand
        verdicts, until it acknowledges (again every heartbeat interval)."""
        for agent, known in self.agents.items():
            if known.greeted or not self.backend.is_connected(agent):
                continue
            if now - known.hello_last >= self.config.heartbeat_interval:
                self._hello(agent, known, now)

    def _hello(self, agent: str, known: PAgent, now: float) -> bool:
        known.hello_last = now
        if known.hello_first is None:
            known.hello_first = now
        return self.backend.send(agent, hello())

    def greeted(self, sender: str) -> None:
        """``OK:leaseproto/1`` from ``sender``: the handshake's acknowledgement,
        taken only from an agent we sent a hello (else counted as foreign)."""
        known = self.agents.get(sender)
        if known is not None and known.hello_first is not None:
            known.greeted = True
        else:
            self.out.counts["foreign_verdicts"] += 1
            self.out.drops.drop("unasked capability answer", f"from {sender}")

    def ready(self, req: Req, engine: Engine, *, now: float) -> bool | str:
        """Whether ``req``'s READs may start (every rank of ``engine`` is
        connected): True once every P agent it verifies greeted us (at once for
        unverified reads), False while one has not yet, or why to give up: an
        agent silent to our hello for :func:`~.decode_state.verdict_wait`."""
        if not req.verified:
            if not engine.unverified_logged:
                engine.unverified_logged = True
                self.out.notes.drop(
                    "unverified reads",
                    f"P engine {engine.engine_id} did not advertise {wire.CAPABILITY}: its "
                    "reads are used unverified (stock vLLM behaviour; a read of freed "
                    "blocks would go unnoticed)",
                )
            return True
        # (every agent of a verified request is in self.agents: decide)
        known = [(r.agent, self.agents.get(r.agent)) for r in req.ranks]
        silent = [(a, k) for a, k in known if k is None or not k.greeted]
        if not silent:
            return True
        wait = verdict_wait(self.config)
        late = [
            a
            for a, k in silent
            if k is not None and k.hello_first is not None and now - k.hello_first > wait
        ]
        if not late:
            return False
        self.out.counts["handshake_timeouts"] += 1
        agent = late[0]
        self.out.drops.drop(
            "P agent silent to our hello",
            f"{agent} did not answer {wire.CAPABILITY} within {wait:g} s",
        )
        return f"P agent {agent} did not answer {wire.CAPABILITY}"
