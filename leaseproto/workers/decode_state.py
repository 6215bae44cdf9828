"""What a decode engine keeps: its options, the P engines it knows, and one
record per request. The transfer parameters the router passes from P to D
are parsed and checked here (a bad field is a ``ValueError`` the engine turns
into a clear error answer, never a crash).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..adapters.xfer import Transfer
from ..core import wire
from ..core.peer import PARAMS_KEY, PeerLease
from .loop import RankOptions

__all__ = ["DecodeOptions", "Engine", "RankParams", "Req"]


@dataclass
class DecodeOptions(RankOptions):
    max_running: int = 4
    step_time: float = 0.0
    on_kv_loss: str = "recompute"
    #: this decode engine's id (a label of its metrics)
    engine_id: str = "decode-engine"
    followers: list[str] = field(default_factory=list)
    #: P's advertised lease settings cannot work with ours (T1/T2): "refuse" its
    #: requests (answered with the reason) or "warn" and serve them
    lease_mismatch: str = "refuse"

    def validate(self) -> None:
        self.check()
        if self.on_kv_loss not in ("recompute", "error"):
            raise ValueError(f"on_kv_loss must be 'recompute' or 'error', got {self.on_kv_loss!r}")
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


def _int(d: dict[str, Any], key: str, minimum: int = 0) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"transfer parameter {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _str(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise ValueError(f"transfer parameter {key!r} must be a non-empty string, got {v!r}")
    return v


@dataclass(frozen=True)
class RankParams:
    """One P rank's share of a request: where to read it and how it is laid out."""

    rank: int
    tp: int
    agent: str
    host: str
    nixl_port: int
    block_ids: tuple[int, ...]
    layout: dict[str, Any]
    lease_remaining: float
    #: the lease settings P advertised (None: P did not advertise ``leaseproto/1``)
    lease: PeerLease | None = None

    @classmethod
    def parse(cls, d: object) -> RankParams:
        if not isinstance(d, dict):
            raise ValueError("each rank's transfer parameters must be a map")
        blocks = d.get("block_ids")
        if not isinstance(blocks, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
        ):
            raise ValueError("transfer parameter 'block_ids' must be a list of block ids")
        layout = d.get("layout")
        if not isinstance(layout, dict):
            raise ValueError("transfer parameter 'layout' must be a map")
        remaining = d.get("lease_remaining", 0.0)
        if isinstance(remaining, bool) or not isinstance(remaining, (int, float)):
            raise ValueError("transfer parameter 'lease_remaining' must be a number of seconds")
        return cls(
            rank=_int(d, "rank"),
            tp=_int(d, "tp", 1),
            agent=_str(d, "agent"),
            host=_str(d, "host"),
            nixl_port=_int(d, "nixl_port", 1),
            block_ids=tuple(blocks),
            layout=layout,
            lease_remaining=float(remaining),
            lease=None if d.get(PARAMS_KEY) is None else PeerLease.parse(d[PARAMS_KEY]),
        )

    def as_msg(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "tp": self.tp,
            "agent": self.agent,
            "host": self.host,
            "nixl_port": self.nixl_port,
            "block_ids": list(self.block_ids),
            "layout": self.layout,
            "lease_remaining": self.lease_remaining,
        }


@dataclass
class Engine:
    """A P engine D depends on: its ranks' agents, and why it was lost (if it was)."""

    engine_id: str
    agents: tuple[str, ...]
    ranks: list[RankParams]
    lost: str = ""


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
    #: ``waiting`` -> ``reading`` -> ``decoding``
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

    @classmethod
    def from_msg(
        cls, envelope: list[bytes], msg: dict[str, Any], *, now: float, block_size: int
    ) -> Req:
        """Parse a ``decode`` request. Raises ``ValueError`` naming the bad field."""
        req_id = _str(msg, "req_id")
        wire.check_id(req_id)
        prompt = msg.get("prompt")
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            raise ValueError("prompt must be a non-empty list of token ids")
        max_tokens = _int(msg, "max_tokens", 1)
        params = msg.get("params")
        if not isinstance(params, dict):
            raise ValueError("decode needs transfer parameters ('params')")
        remote = _str(params, "remote_req_id")
        wire.check_id(remote)
        ranks_raw = params.get("ranks")
        if not isinstance(ranks_raw, list) or not ranks_raw:
            raise ValueError("transfer parameter 'ranks' must be a non-empty list")
        ranks = sorted((RankParams.parse(r) for r in ranks_raw), key=lambda r: r.rank)
        if [r.rank for r in ranks] != list(range(len(ranks))) or any(
            r.tp != len(ranks) for r in ranks
        ):
            raise ValueError("transfer parameters must name every P rank exactly once")
        need = -(-len(prompt) // block_size)
        for r in ranks:
            if len(r.block_ids) != need:
                raise ValueError(
                    f"P rank {r.rank} sent {len(r.block_ids)} block ids for a "
                    f"{len(prompt)}-token prompt ({need} blocks of {block_size})"
                )
        first = ranks_raw[0].get("first_token") if isinstance(ranks_raw[0], dict) else None
        if isinstance(first, bool) or not isinstance(first, int):
            raise ValueError("transfer parameter 'first_token' must be a token id")
        return cls(
            envelope=envelope,
            req_id=req_id,
            prompt=list(prompt),
            max_tokens=max_tokens,
            remote_req_id=remote,
            engine_id=_str(params, "engine_id"),
            ranks=ranks,
            first_token=first,
            num_tokens=len(prompt),
            arrived=now,
        )
