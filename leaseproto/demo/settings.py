"""What ``leaseproto demo`` runs with (:class:`DemoSettings`) and what it measures
in each of its first three phases (:class:`PhaseResult`); the multi-turn phases'
figures are :class:`~.turns.TurnsResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.config import LeaseConfig

__all__ = ["DemoSettings", "PhaseResult"]


@dataclass
class DemoSettings:
    device: str = "cpu"
    kv_lease_duration: float = 3.0
    #: requests in the first wave of a surge, then ``wave`` more per second
    first_wave: int = 16
    waves: int = 5
    wave: int = 4
    max_tokens: int = 12
    prompt_len: int = 10
    max_running: int = 2
    #: modelled forward-pass time of one D step (seconds)
    d_step_time: float = 0.08
    crash_requests: int = 10
    seed: int = 1
    log_dir: str | None = None
    #: the lease phases run with this cluster key (the fixed-timeout phase cannot: it
    #: has no greeting to open a sealed connection with)
    cluster_key_file: str | None = None
    #: the multi-turn phases: conversations, D's cached-turn lease
    #: (``decoder_kv_blocks_ttl``, compressed like the 3 s leases) and the read
    #: gate's margin (vLLM's 5 s against its 480 s TTL, compressed too); 0
    #: conversations skips them
    conversations: int = 3
    turn_ttl: float = 2.0
    turn_margin: float = 0.25

    @property
    def heartbeat_interval(self) -> float:
        return LeaseConfig(self.kv_lease_duration).heartbeat_interval

    @property
    def lease_extension(self) -> float:
        return LeaseConfig(self.kv_lease_duration).lease_extension


@dataclass
class PhaseResult:
    name: str
    policy: str
    requests: int = 0
    answered: int = 0
    identical: int = 0
    differing: int = 0
    failed: int = 0
    recomputed: int = 0
    leases_expired: int = 0
    late_transfers: int = 0
    nacks: int = 0
    reclaim_s: float | None = None
    reclaim_bound_s: float | None = None
    blocks_leaked: int = 0
    longest_wait_s: float = 0.0
    #: reads used only after P's OK, and their mean wait for it (the cost of verified reads)
    verified_reads: int = 0
    verdict_wait_ms: float | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
