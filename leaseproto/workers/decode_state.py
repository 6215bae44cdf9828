"""What a decode engine keeps: its options, the P engines it knows, one
record per request, and where its parts report (:class:`Reporting`). The
transfer parameters the router passes from P to D are parsed and checked here
(a bad field is a ``ValueError`` the engine turns into a clear error answer,
never a crash).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..adapters.xfer import Transfer
from ..core import wire
from ..core.config import LeaseConfig
from .loop import RankOptions
from .messages import Decode, RankParams, parse
from .notifications import DropLog

if TYPE_CHECKING:
    from .metrics import DecodeMetrics

__all__ = [
    "COUNTS",
    "DecodeOptions",
    "Engine",
    "PAgent",
    "RankParams",
    "Reporting",
    "Req",
    "hello",
    "verdict_wait",
]

#: What decode rank 0 counts (its ``stats``).
# fmt: off
COUNTS = (
    "completed", "recomputed", "failed", "nacks", "nack_after_answer", "malformed",
    "heartbeats_sent", "engines_dropped", "late_first_heartbeats", "verified_reads",
    "unverified_reads", "verdicts_nk", "verdict_timeouts", "verdict_wait_us", "lease_lost",
    "foreign_verdicts", "contradicting_requests", "handshake_timeouts",
)
# fmt: on


def verdict_wait(config: LeaseConfig) -> float:
    """How long D waits for a verdict after its READ completed: one
    ``lease_extension``. A P that cannot answer a transfer-done within that
    time could not have kept a lease alive through it either (a heartbeat gets
    the same handling), so waiting longer buys nothing; waiting less only
    recomputes more. Safety does not depend on it: without ``OK`` nothing read
    is used."""
    return config.lease_extension


def hello() -> bytes:
    """What a decode rank sends a P rank that advertised verdicts, before its
    first read: a heartbeat naming the capability token (a stock P ignores it
    as an unknown id); P answers ``OK:leaseproto/1``."""
    return wire.HEARTBEAT_PREFIX + wire.CAPABILITY.encode()


@dataclass
class DecodeOptions(RankOptions):
    max_running: int = 4
    step_time: float = 0.0
    on_kv_loss: str = "recompute"
    #: this decode engine's id (a label of its metrics)
    engine_id: str = "decode-engine"
    #: wait for P's verdicts before using a read (off: use reads as stock vLLM does;
    #: for measuring what verified reads cost)
    verify_reads: bool = True
    followers: list[str] = field(default_factory=list)
    #: P's advertised lease settings cannot work with ours (T1/T2): "refuse" its
    #: requests (answered with the reason) or "warn" and serve them
    lease_mismatch: str = "refuse"

    def validate(self) -> None:
        self.check()
        if self.on_kv_loss == "fail":
            self.on_kv_loss = "error"
        if self.on_kv_loss not in ("recompute", "error"):
            raise ValueError(
                f"on_kv_loss must be 'recompute' or 'fail' ('error'), got {self.on_kv_loss!r}"
            )
        if self.rank == 0 and len(self.followers) != self.tp - 1:
            raise ValueError(
                f"rank 0 of a {self.tp}-rank decode engine needs {self.tp - 1} "
                f"--follower addresses, got {len(self.followers)}"
            )
        if self.lease_mismatch not in ("refuse", "warn"):
            raise ValueError(
                f"lease_mismatch must be 'refuse' or 'warn', got {self.lease_mismatch!r}"
            )
        if self.max_running < 1:
            raise ValueError("max_running must be >= 1")
        if self.step_time < 0:
            raise ValueError("step_time must be >= 0")
        if self.cluster_key is not None and not self.verify_reads:
            raise ValueError(
                "a cluster key cannot be combined with unverified reads (the greeting "
                "that opens a sealed connection is the verdict handshake)"
            )


@dataclass
class Engine:
    """A P engine D depends on: its ranks' agents, and why it was lost (if it was)."""

    engine_id: str
    agents: tuple[str, ...]
    ranks: list[RankParams]
    lost: str = ""
    unverified_logged: bool = False


@dataclass
class PAgent:
    """A P agent whose reads D verifies (spec §7.4): where the first request
    that made D verify it placed it (engine, rank, address), and the
    capability handshake. Kept for D's lifetime: no message turns it off."""

    engine_id: str
    rank: int
    tp: int
    host: str
    port: int
    hello_first: float | None = None
    hello_last: float = -math.inf
    #: it answered our hello with ``OK:leaseproto/1``
    greeted: bool = False

    @classmethod
    def at(cls, engine_id: str, r: RankParams) -> PAgent:
        return cls(engine_id, r.rank, r.tp, r.host, r.nixl_port)

    def misplaced(self, engine_id: str, r: RankParams) -> str | None:
        """Why ``r`` (a rank of a request for ``engine_id``) places this agent
        elsewhere than D knows it, or None."""
        known = (self.engine_id, self.rank, self.tp, self.host, self.port)
        if (engine_id, r.rank, r.tp, r.host, r.nixl_port) == known:
            return None
        return (
            f"P agent {r.agent} is rank {self.rank}/{self.tp} of P engine {self.engine_id} at "
            f"{self.host}:{self.port}, not rank {r.rank}/{r.tp} of {engine_id} at "
            f"{r.host}:{r.nixl_port}"
        )


@dataclass(eq=False)
class Req:
    """One request on D, from the waiting queue to its answer."""

    envelope: list[bytes]
    req_id: str
    prompt: list[int]
    max_tokens: int
    remote_req_id: str
    engine_id: str
    ranks: list[RankParams]
    first_token: int
    num_tokens: int
    arrived: float
    #: ``waiting`` -> ``reading`` -> ``verifying`` -> ``decoding``
    state: str = "waiting"
    needs_remote_kv: bool = True
    #: every READ of P's KV completed
    kv_in: bool = False
    recompute: bool = False
    done: bool = False
    blocks: list[int] = field(default_factory=list)
    #: the token decoding starts from (P's, or our own after a recompute)
    start_token: int = 0
    #: the output, once the model has run
    tokens: list[int] = field(default_factory=list)
    steps_left: int = 0
    first_heartbeat_sent: bool = False
    #: when its KV reads started (D's clock)
    read_started: float = 0.0
    #: keep the turn's KV under a lease when it finishes (a conversation's turn)
    cache_turn: bool = False

    def first_heartbeat(self, now: float) -> float | None:
        """Note the first heartbeat for this request; how long after the
        initial lease ran out it leaves (P reported the lease left as a
        duration, anchored here at our receipt), or None if in time or not
        the first."""
        if self.first_heartbeat_sent:
            return None
        self.first_heartbeat_sent = True
        late = now - (self.arrived + min(r.lease_remaining for r in self.ranks))
        return late if late > 0 else None

    transfers: list[Transfer] = field(default_factory=list)
    followers_pending: set[int] = field(default_factory=set)
    #: reads of this request wait for verdicts (decided at intake: it advertised
    #: ``leaseproto/1``, or its engine or one of its P agents is known to give them)
    verified: bool = False
    #: P ranks (agents) whose verdict on rank 0's reads is still awaited
    verdicts_due: set[str] = field(default_factory=set)
    #: every P agent whose OK the read waits for (for the trace)
    ok_from: list[str] = field(default_factory=list)
    read_done_at: float = 0.0
    #: discard what was read if a verdict is still missing at this instant
    verify_by: float = 0.0

    @classmethod
    def from_msg(
        cls, envelope: list[bytes], msg: dict[str, Any], *, now: float, block_size: int
    ) -> Req:
        """Parse a ``decode`` request (:class:`~.messages.Decode`), then check
        what its type cannot say. Raises ``ValueError`` (``BadMessage``) naming
        the bad field."""
        m = parse(msg, Decode)
        wire.check_id(m.req_id)
        wire.check_id(m.params.remote_req_id)
        ranks = sorted(m.params.ranks, key=lambda r: r.rank)
        if [r.rank for r in ranks] != list(range(len(ranks))) or any(
            r.tp != len(ranks) for r in ranks
        ):
            raise ValueError("transfer parameters must name every P rank exactly once")
        if len({r.verdicts for r in ranks}) > 1:  # one P engine: one setting on every rank
            raise ValueError(
                f"transfer parameters: some P ranks advertise {wire.CAPABILITY}, some do not"
            )
        need = -(-len(m.prompt) // block_size)
        for r in ranks:
            if len(r.block_ids) != need:
                raise ValueError(
                    f"P rank {r.rank} sent {len(r.block_ids)} block ids for a "
                    f"{len(m.prompt)}-token prompt ({need} blocks of {block_size})"
                )
        first = ranks[0].first_token
        if first is None:
            raise ValueError("transfer parameter 'first_token' of P rank 0 is missing")
        return cls(
            envelope=envelope,
            req_id=m.req_id,
            prompt=m.prompt,
            max_tokens=m.max_tokens,
            remote_req_id=m.params.remote_req_id,
            engine_id=m.params.engine_id,
            ranks=ranks,
            first_token=first,
            num_tokens=len(m.prompt),
            arrived=now,
            cache_turn=m.cache_turn,
        )


@dataclass
class Reporting:
    """Where the parts of decode rank 0 say what happened: the counters of its
    ``stats`` (:data:`COUNTS`), its Prometheus metrics, and two rate-limited
    logs (``drops``: what a peer or client sent that was refused or dropped;
    ``notes``: the other lines a peer or client can trigger). Written by every
    part, never read back to decide anything."""

    metrics: DecodeMetrics
    drops: DropLog
    notes: DropLog
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))

    def malformed(self, why: str) -> None:
        """A message (request plane or NIXL) that could not be used: counted, logged."""
        self.counts["malformed"] += 1
        self.metrics.malformed.inc()
        self.drops.drop("malformed message", why)
