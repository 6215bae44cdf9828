"""What one policy's run measured: the per-policy figures and the raw series."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

__all__ = ["FIGURE_LABELS", "Figures", "Series", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), nearest-rank; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Series:
    """Samples on a fixed grid of virtual time."""

    t: list[float] = field(default_factory=list)
    #: KV blocks P holds under a lease, all P engines together
    p_blocks: list[int] = field(default_factory=list)
    #: live leases, all P engines
    live_leases: list[int] = field(default_factory=list)
    #: requests in D waiting queues, all D engines
    d_waiting: list[int] = field(default_factory=list)
    #: heartbeat messages sent so far
    hb_msgs: list[int] = field(default_factory=list)


@dataclass
class Figures:
    """One policy's figures. Times in seconds of virtual time."""

    policy: str
    requests: int = 0
    granted: int = 0
    released_transferred: int = 0
    released_expired: int = 0
    released_aborted: int = 0
    #: requests whose D died holding them (in its queue, reading, or routed to it dead)
    stranded: int = 0
    #: KV block-seconds P held for requests whose D was dead
    stranded_block_s: float = 0.0
    #: leases released by expiry while their (live) D still needed the blocks
    expired_while_needed: int = 0
    #: transfer-done after expiry (the table's LateTransfer): a read of freed blocks
    late_reads: int = 0
    death_to_release_p50: float | None = None
    death_to_release_p99: float | None = None
    death_to_release_max: float | None = None
    p_blocks_peak: int = 0
    #: mean over the arrivals window
    p_blocks_mean: float = 0.0
    #: heartbeat messages and bytes per second over the arrivals window
    hb_msgs_per_s: float = 0.0
    hb_bytes_per_s: float = 0.0
    #: heartbeat bytes per lease renewal, whole run
    hb_bytes_per_renewal: float | None = None
    #: request ids carried by heartbeats (all messages, whole run)
    hb_ids: int = 0
    renewals: int = 0
    #: D waiting-queue time, 99th percentile (how deep the surge went)
    d_wait_p99: float | None = None
    #: virtual time when the last lease was released
    end_time: float = 0.0
    events: int = 0
    #: wall and CPU seconds of this policy's run (not results: they vary run to run)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    death_to_release: list[float] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.pop("death_to_release")
        return d


#: Rows of the comparison table: (attribute, label, format).
FIGURE_LABELS: tuple[tuple[str, str, str], ...] = (
    ("requests", "requests", "{:d}"),
    ("stranded", "requests stranded by a dead D", "{:d}"),
    ("stranded_block_s", "block-seconds held for a dead D", "{:,.0f}"),
    ("death_to_release_p50", "D death -> release p50 (s)", "{:.1f}"),
    ("death_to_release_p99", "D death -> release p99 (s)", "{:.1f}"),
    ("death_to_release_max", "D death -> last block freed (s)", "{:.1f}"),
    ("expired_while_needed", "leases expired while D needed them", "{:d}"),
    ("late_reads", "transfers done after expiry", "{:d}"),
    ("p_blocks_peak", "P blocks held, peak", "{:,d}"),
    ("p_blocks_mean", "P blocks held, mean", "{:,.0f}"),
    ("hb_msgs_per_s", "heartbeat messages/s", "{:.2f}"),
    ("hb_bytes_per_s", "heartbeat bytes/s", "{:,.0f}"),
    ("hb_bytes_per_renewal", "heartbeat bytes per renewal", "{:.1f}"),
    ("d_wait_p99", "D queue wait p99 (s)", "{:.1f}"),
    ("released_transferred", "released: transferred", "{:d}"),
    ("released_expired", "released: expired", "{:d}"),
)
