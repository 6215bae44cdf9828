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

__all__ = ["QUICK", "SCOPES", "Scope", "scope_config"]


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
    #: re-grants keep A7 (spec §3.3): an id is granted again on a rank only once
    #: nothing of its last lease there can act (D holds nothing of it, no notification
    #: naming it is on its way). False re-grants any ended id, which breaks I13
    #: (tests/test_checker.py)
    unique_ids: bool = True
    #: D samples each P's clock in a handshake and reads only through the gate (I9)
    gate: bool = False
    #: P's clock minus D's, ticks (scopes with ``gate``)
    skew: int = 0
    #: the gate's margin, ticks
    gate_margin: int = 2
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


def cap_config() -> LeaseConfig:
    """The scope configuration with a cap of 7 ticks (C4: at least L)."""
    return replace(scope_config(), max_lease_lifetime=7.0)


SCOPES: dict[str, Scope] = {
    # the normal test suite: exhaustive in about a second
    "small": Scope("small", requests=1, p_ranks=1, d_ranks=1, dups=0, d_crash=False),
    # two P ranks: early notifications (staged before a rank's grant), aborts before a grant
    "ranks": Scope("ranks", requests=1, p_ranks=2, d_ranks=1, dups=0, d_crash=False),
    # two requests on one rank: tombstone order, heap order
    "two": Scope("two", requests=2, p_ranks=1, d_ranks=1, dups=0, d_crash=False),
    # D with two ranks: each reads and sends its own transfer-done, readers n = 2 from the wire
    "d2": Scope("d2", requests=1, p_ranks=1, d_ranks=2, dups=0, d_crash=False),
    # a lifetime cap of 7 ticks: D heartbeats on, P still releases by granted_at + C (I7)
    "cap": Scope("cap", requests=1, p_ranks=1, d_ranks=1, dups=0, config=cap_config()),
    # the clock handshake and the read gate (I9): P's clock 3 ticks ahead, the hello sent at
    # any instant, reads only through the gate, and a pause of D (so reads come near the deadline)
    "gate": Scope(
        "gate",
        requests=1,
        p_ranks=1,
        d_ranks=1,
        losses=0,
        d_pause=2,
        dups=0,
        aborts=False,
        d_crash=False,
        gate=True,
        skew=3,
    ),
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
    # leaseproto check --scope large (its figure in docs/verification.md)
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


def _one_tombstone() -> LeaseConfig:
    return replace(scope_config(), tombstone_capacity=1)


#: The quick scopes: what the test suite and the mutation run (tools/mutation_run.py)
#: explore on every change, ``small`` exhaustively and the others bounded.
QUICK: dict[str, Scope] = {
    "small": SCOPES["small"],
    "small-crash": SCOPES["small"].with_(name="small-crash", d_crash=True),
    "ranks": SCOPES["ranks"].with_(max_states=3_000),
    "two": SCOPES["two"].with_(max_states=3_000),
    "two-tomb1": SCOPES["two"].with_(name="two-tomb1", config=_one_tombstone(), max_states=3_000),
    "schedule": SCOPES["schedule"].with_(max_states=3_000),
    "faults": SCOPES["faults"].with_(max_states=3_000),
    "d2": SCOPES["d2"].with_(max_states=5_000),
    "cap": SCOPES["cap"],
    "gate": SCOPES["gate"].with_(max_states=3_000),
}
