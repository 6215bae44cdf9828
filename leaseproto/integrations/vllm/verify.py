"""Verified reads on D (invariant I13), with no vLLM import.

A READ from a P that advertised ``leaseproto/1`` is reported to vLLM's scheduler
(``finished_recving``) only once *every* P agent (rank) it read from answered its
transfer-done with ``OK:``; on ``NK:`` from any of them, or without all verdicts
within the bound, it is reported as a failed load, so vLLM's
``kv_load_failure_policy`` (recompute) takes over. With heterogeneous TP one D
rank reads several P ranks (P TP > D TP), each with its own lease and verdict;
the worker names each agent a READ goes to (:meth:`ReadVerifier.expect`), so the
verifier waits for exactly those. A verdict or ``LL:`` from any other agent
(one the read did not go to, or one that never was a peer) is counted and
ignored. A READ from a stock P is passed through unverified, as stock vLLM does.

For P to answer, it must be able to notify D: D's first message to an
advertised P is a hello carrying D's NIXL agent metadata, which P loads.
The hello contains ``,`` right after its first word, so it can never parse as a
vLLM message (a request id has no ``,``; a heartbeat starts with ``HB:``), and it
is only ever sent to a P that advertised.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from leaseproto import wire

from .config import seconds_below

__all__ = [
    "DEFAULT_VERDICT_WAIT",
    "HELLO_PREFIX",
    "VERDICT_WAIT_KEY",
    "ReadVerifier",
    "Settled",
    "VerdictWaits",
    "VerifierStats",
    "agent_name",
    "decode_hello",
    "encode_hello",
    "verdict_wait",
]

#: D -> P: "I understand leaseproto/1; here is my NIXL agent metadata".
HELLO_PREFIX = (wire.CAPABILITY + ",hello,").encode()

#: ``kv_connector_extra_config`` key: the most seconds one of D's engine steps waits,
#: in the step that sees READs complete, for their verdicts (0: never wait).
VERDICT_WAIT_KEY = "verdict_wait"
#: Its default: short beside a decode step, so that a wait in vain costs the requests D
#: is decoding little (docs/vllm.md measures it against 0 and 0.05 s).
DEFAULT_VERDICT_WAIT = 0.010


def verdict_wait(extra: Mapping[str, Any] | None, bound: float) -> float:
    """``extra[VERDICT_WAIT_KEY]`` (default :data:`DEFAULT_VERDICT_WAIT`), checked.

    Raises:
        ValueError: not a finite number of seconds, or negative, or not below the
            verdict bound ``bound`` (past it the READ has failed anyway).
    """
    return seconds_below(
        extra,
        VERDICT_WAIT_KEY,
        DEFAULT_VERDICT_WAIT,
        bound,
        "the verdict bound (lease_extension)",
    )


@dataclass
class VerdictWaits:
    """When D's step waits for the verdicts of the READs it saw complete.

    P answers a transfer-done in the step that polls it, so with P's engine
    stepping the verdict usually follows the READ by one of P's steps. Waiting up
    to ``wait`` for it in the step that saw the READ complete reports the READ
    in that step, as stock vLLM does, instead of in D's next one. A P whose steps
    are longer than that (busy prefilling) would make every such step wait in
    vain: an agent whose verdict a wait missed is waited for again only
    ``retry_after`` seconds later, so it costs D at most one wait per
    ``retry_after``."""

    wait: float
    retry_after: float
    #: agent -> when a wait last ended without its verdict
    _missed: dict[str, float] = field(default_factory=dict)

    def worth(self, agents: Iterable[str], *, now: float) -> bool:
        """Whether to wait for verdicts from ``agents``."""
        if self.wait <= 0:
            return False
        missed, after = self._missed, self.retry_after
        return all(now - missed.get(a, -math.inf) >= after for a in agents)

    def ended(self, asked: Iterable[str], missing: Iterable[str], *, now: float) -> None:
        """A wait for ``asked`` ended with the verdicts of ``missing`` still missing."""
        missing = set(missing)
        after = self.retry_after
        # only misses within retry_after matter: the map holds no agent that left
        kept = {a: t for a, t in self._missed.items() if now - t < after and a not in asked}
        kept.update((a, now) for a in missing)
        self._missed = kept


def agent_name(name: str | bytes) -> str:
    """A NIXL agent name as notifications are keyed by it (``str``). NIXL 1.5's
    ``add_remote_agent`` returns bytes, and vLLM keeps them in ``_remote_agents``."""
    return name.decode() if isinstance(name, bytes) else str(name)


def encode_hello(agent_metadata: bytes) -> bytes:
    return HELLO_PREFIX + bytes(agent_metadata)


def decode_hello(raw: bytes) -> bytes | None:
    """D's agent metadata if ``raw`` is a hello, else ``None``."""
    data = bytes(raw)
    return data[len(HELLO_PREFIX) :] if data.startswith(HELLO_PREFIX) else None


@dataclass
class VerifierStats:
    verified: int = 0  # READs reported after OK from every agent read
    refused: int = 0  # READs failed on an NK
    timed_out: int = 0  # READs failed for want of every verdict within the bound
    lease_lost: int = 0  # advisory LL answers received from an agent read
    unverified: int = 0  # READs from a P that did not advertise
    foreign: int = 0  # verdicts or LL from an agent the read did not go to (ignored)
    unmatched: int = 0  # verdicts or LL naming no read in progress (late, duplicate, forged)
    stale: int = 0  # READs that never completed within stale_after: forgotten, failed if seen


@dataclass(frozen=True)
class Settled:
    """A READ the verifier reported: used (``ok``) or failed, and why."""

    local_id: str
    remote_id: str
    agents: list[str]
    ok: bool
    how: str


@dataclass
class _Read:
    remote_id: str
    expected_at: float
    agents: set[str] = field(default_factory=set)  # every agent read
    due: set[str] = field(default_factory=set)  # agents whose OK is still missing
    refused: bool = False
    completed_at: float | None = None
    why: str = ""  # what refused it (for D's log)


@dataclass
class ReadVerifier:
    """Holds finished READs back until their verdicts; ``bound`` seconds after
    a READ completes without all of them, it fails.

    A READ that neither completes nor fails within ``stale_after`` seconds of
    its first :meth:`expect` is forgotten (vLLM lost it on some failure path);
    its id is kept in a bounded list so that, should it complete after all, it
    fails rather than pass unverified."""

    bound: float
    stale_after: float = 300.0
    max_forgotten: int = 4096
    stats: VerifierStats = field(default_factory=VerifierStats)
    _reads: dict[str, _Read] = field(default_factory=dict)  # local id -> read
    _by_remote: dict[str, list[str]] = field(default_factory=dict)  # P's id -> local ids
    _forgotten: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _silent: set[str] = field(default_factory=set)  # agents that left a verdict out
    #: READs settled since :meth:`take_settled`
    _settled: list[Settled] = field(default_factory=list)

    def expect(self, local_id: str, remote_id: str, agent: str, *, now: float) -> None:
        """The READ of ``remote_id`` (P's id) for ``local_id`` goes to P agent
        ``agent`` (once per P rank read), which advertised ``leaseproto/1``."""
        self._forgotten.pop(local_id, None)
        read = self._reads.get(local_id)
        if read is None:
            read = self._reads[local_id] = _Read(remote_id, now)
            self._by_remote.setdefault(remote_id, []).append(local_id)
        elif read.remote_id != remote_id:  # one request, two P ids: nothing vLLM does
            read.refused = True
            return
        read.agents.add(agent)
        read.due.add(agent)

    def forget(self, local_id: str) -> None:
        """The READ was routed to vLLM's failure reporting before it completed."""
        self._drop(local_id)

    def on_message(self, msg: wire.Message, sender: str) -> str | None:
        """An ``OK:``, ``NK:`` or ``LL:`` from P agent ``sender`` (others are
        ignored). Returns why it was ignored (``"foreign"``, ``"unmatched"``),
        or ``None`` if it counted."""
        if not isinstance(msg, (wire.Ok, wire.Nack, wire.LeaseLost)):
            return None
        locals_ = self._by_remote.get(msg.req_id, ())
        reads = [r for r in (self._reads[k] for k in locals_) if sender in r.agents]
        if not reads:
            kind = "foreign" if locals_ else "unmatched"
            if locals_:
                self.stats.foreign += 1
            else:
                self.stats.unmatched += 1
            return kind
        if isinstance(msg, wire.LeaseLost):
            self.stats.lease_lost += 1  # advisory: the verdict still decides
        elif isinstance(msg, wire.Nack):
            for read in reads:  # one NK is enough: what was read is suspect
                read.refused = True
                read.why = read.why or f"NK:{msg.reason} from {sender}"
                read.due.discard(sender)
        else:
            waiting = [r for r in reads if sender in r.due]
            if not waiting:  # a second OK for one transfer-done: changes nothing
                self.stats.unmatched += 1
                return "unmatched"
            waiting[0].due.discard(sender)  # one OK answers one transfer-done
        return None

    def settle(self, done: set[str], failed: set[str], *, now: float) -> tuple[set[str], set[str]]:
        """vLLM's finished and failed READs of this step -> what to report now.

        Returns ``(done, failed)``: a failed id is also in ``done`` (vLLM's
        convention); READs waiting for their verdicts are in neither."""
        out_done, out_failed = set(done), set(failed)
        for local in failed:
            self._drop(local)
        for local in done - failed:
            read = self._reads.get(local)
            if read is not None and read.completed_at is None:
                read.completed_at = now
            elif read is None and local in self._forgotten:
                del self._forgotten[local]
                out_failed.add(local)  # never verified: fail, never pass through
        for local, read in list(self._reads.items()):
            if read.completed_at is None:
                if now - read.expected_at >= self.stale_after:
                    self.stats.stale += 1
                    self._drop(local)
                    self._forgotten[local] = None
                    while len(self._forgotten) > self.max_forgotten:
                        self._forgotten.popitem(last=False)
                continue
            ok: bool | None = False if read.refused else (True if not read.due else None)
            if ok is None and now - read.completed_at < self.bound:
                out_done.discard(local)  # held: a verdict is missing
                continue
            if ok:
                self.stats.verified += 1
                how = "verified"
            elif ok is None:
                self.stats.timed_out += 1
                self._silent.update(read.due)
                how = f"no verdict from {', '.join(sorted(read.due))} within {self.bound:g} s"
            else:
                self.stats.refused += 1
                how = read.why or "refused"
            self._settled.append(Settled(local, read.remote_id, sorted(read.agents), bool(ok), how))
            if not ok:
                out_failed.add(local)
            out_done.add(local)
            self._drop(local)
        return out_done, out_failed

    def take_silent(self) -> set[str]:
        """Agents whose verdict a READ timed out waiting for, since the last call."""
        out, self._silent = self._silent, set()
        return out

    def take_settled(self) -> list[Settled]:
        """READs settled (used or failed) since the last call."""
        out, self._settled = self._settled, []
        return out

    def held(self) -> list[str]:
        """Local ids of finished READs waiting for a verdict."""
        return [k for k, r in self._reads.items() if r.completed_at is not None]

    def awaiting(self, local_ids: Iterable[str]) -> set[str]:
        """The agents whose OK the finished, unrefused READs among ``local_ids``
        still wait for (an NK settles a READ: nothing more to wait for)."""
        out: set[str] = set()
        reads = self._reads
        for local in local_ids:
            read = reads.get(local)
            if read is not None and read.completed_at is not None and not read.refused:
                out |= read.due
        return out

    def missing(self, local_id: str) -> set[str]:
        """The agents whose OK the READ of ``local_id`` still waits for."""
        read = self._reads.get(local_id)
        return set() if read is None else set(read.due)

    def __len__(self) -> int:
        return len(self._reads)

    def _drop(self, local: str) -> None:
        read = self._reads.pop(local, None)
        if read is None:
            return
        others = [k for k in self._by_remote.get(read.remote_id, ()) if k != local]
        if others:
            self._by_remote[read.remote_id] = others
        else:
            self._by_remote.pop(read.remote_id, None)
