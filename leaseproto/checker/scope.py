"""Scopes of the explicit-state model checker: how many requests, ranks and
faults, and the configuration they run under (spec §5 bounds, in ticks).

Time is a grid of integer instants (one tick = one second of every side's
clock); every deadline the configuration produces lands on the grid, so
``now == deadline`` is always among the instants explored. Within one instant
every step (P's reap, D's heartbeat step, deliveries, reads...) interleaves
freely; ``tick`` moves to the next instant only when each live side has stepped
at this one and no message is older than ``delay`` ticks (§5.2's bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.config import LeaseConfig

__all__ = ["SCOPES", "Scope", "scope_config"]


def scope_config() -> LeaseConfig:
    """L 5, H 1, E 4 ticks. With notifications arriving ``delay`` = 1 tick after
    they are sent, one router tick and one lost heartbeat in a row, §5.3's
    conditions hold on the grid: T1 ``R + H + losses*H + delay < L`` (1 + 1 + 1 + 1 = 4 < 5)
    and T2 ``H + losses*H + delay < E`` (1 + 1 + 1 = 3 < 4)."""
    return LeaseConfig(
        kv_lease_duration=5.0,
        heartbeat_interval=1.0,
        lease_extension=4.0,
        tombstone_ttl=8.0,
        tombstone_capacity=2,
        staging_ttl=5.0,
        staging_capacity=2,
    )


@dataclass(frozen=True)
class Scope:
    """One bounded world. Fault budgets are totals over a run."""

    name: str
    requests: int = 2
    p_ranks: int = 2
    d_ranks: int = 1
    #: a notification arrives 1 to ``delay`` ticks after it was sent (or is lost)
    delay: int = 1
    #: heartbeats the network may lose (at most one in a row per engine: T1/T2)
    losses: int = 1
    #: notifications the network may duplicate
    dups: int = 1
    #: D may abort a request it tracks
    aborts: bool = True
    #: D may crash (stops for good)
    d_crash: bool = True
    #: ticks D may pause once (0: never). A pause breaks §5's assumptions.
    d_pause: int = 0
    #: P ranks may restart (losing their table) this many times in all
    p_restarts: int = 0
    #: D's connection to a P engine may drop and come back (pending meanwhile)
    reconnects: int = 0
    #: P may grant an ended id again this many times in all
    regrants: int = 0
    #: stop after this many distinct states (reported as a bounded run)
    max_states: int = 200_000
    config: LeaseConfig = field(default_factory=scope_config)

    def with_(self, **kw: object) -> Scope:
        return replace(self, **kw)  # type: ignore[arg-type]


def schedule_config() -> LeaseConfig:
    """H 2 ticks (so engines can fall out of step), E 4, L 6; no losses:
    T1 ``R + H + delay < L`` (1 + 2 + 1 < 6), T2 ``H + delay < E`` (2 + 1 < 4)."""
    return LeaseConfig(
        kv_lease_duration=6.0,
        heartbeat_interval=2.0,
        lease_extension=4.0,
        tombstone_ttl=8.0,
        tombstone_capacity=2,
        staging_ttl=6.0,
        staging_capacity=2,
    )


SCOPES: dict[str, Scope] = {
    # the normal test suite: exhaustive in about a second
    "small": Scope("small", requests=1, p_ranks=1, d_ranks=1, dups=0, d_crash=False),
    # two P ranks: early notifications (staged before a rank's grant), aborts before a grant
    "ranks": Scope("ranks", requests=1, p_ranks=2, d_ranks=1, dups=0, d_crash=False),
    # two requests on one rank: tombstone order, heap order
    "two": Scope("two", requests=2, p_ranks=1, d_ranks=1, dups=0, d_crash=False),
    # D's schedule over two engines that fall out of step (a lost connection)
    "schedule": Scope(
        "schedule",
        requests=1,
        p_ranks=2,
        losses=0,
        dups=0,
        d_crash=False,
        aborts=False,
        reconnects=1,
        config=schedule_config(),
    ),
    # faults: D crashes or pauses past its lease, P restarts, ids are granted again
    "faults": Scope(
        "faults", requests=1, p_ranks=1, d_ranks=1, dups=1, d_pause=5, p_restarts=1, regrants=1
    ),
    # leaseproto check --scope large (the README's figure)
    "large": Scope(
        "large",
        requests=2,
        p_ranks=2,
        d_ranks=1,
        dups=1,
        d_pause=5,
        regrants=1,
        max_states=1_000_000,
    ),
}
