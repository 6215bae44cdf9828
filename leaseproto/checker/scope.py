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
    #: the router may give up on a request, for every cause the router has
    #: (:mod:`.giveups`, I17)
    router: bool = False
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
    #: the drift bound D's ClockOffset ages its sample by (A5's rho; scopes with ``gate``)
    rho: float = 0.0
    #: D's clock advances ``d_rate`` ticks per tick of P's (scopes with ``gate``; 1: no
    #: drift). A5 allows ``(1 - rho) / (1 + rho) <= d_rate <= (1 + rho) / (1 - rho)``
    d_rate: float = 1.0
    #: the ``consumers`` each grant names (the readers, unless a transfer-done's ``n``
    #: says otherwise: D's ranks send ``n`` = ``d_ranks``)
    consumers: int = 1
    #: P's deadline queue is compacted once its stale entries exceed the live leases
    #: by this many (None: the table's own 1024, which no scope reaches;
    #: :mod:`.compaction`)
    compaction_slack: int | None = None
    #: P's loop asks its table ``next_deadline()`` (with the lazy requeue it does);
    #: False: the answer is checked on a copy, the explored table never asked
    wakes: bool = False
    #: the turn-2 read of spec §2.8 (I14-I16): the grantor ranks are D's, holding the
    #: turn's cached KV under ``decoder_kv_blocks_ttl`` in their real tables; the reader
    #: is P, which heartbeats D while its turn-2 request waits, reads, sends each D rank
    #: its transfer-done and uses the prefix only after every ``OK`` (else recomputes).
    #: The same table, tracker and wire run with the roles swapped; the invariants
    #: report the mirrored ids (I13 as I14; I5, I6, I8, I11 as I16)
    mirror: bool = False
    #: push mode (spec §2.8, I15; with ``mirror``): the grantor ranks hold push
    #: registrations (``decoder_kv_blocks_ttl``, the default of
    #: ``push_registration_timeout``), the reader's ranks WRITE into them and D decides
    #: the use and the quarantine (:mod:`.push_world`)
    push: bool = False
    #: the grantor may end this many registrations itself in all (push: D's request
    #: went away)
    cancels: int = 0
    #: the reader's tracker runs on the reader's own clock (``d_rate`` ticks per tick),
    #: so drift shows in its heartbeat schedule; False: on the grid
    reader_clock: bool = False
    #: stop after this many distinct states (reported as a bounded run); each scope of
    #: SCOPES but ``large`` sets it above its own state count, so ``leaseproto check
    #: --scope S`` as typed is exhaustive
    max_states: int = 200_000
    config: LeaseConfig = field(default_factory=scope_config)

    def __post_init__(self) -> None:
        lo, hi = (1 - self.rho) / (1 + self.rho), (1 + self.rho) / (1 - self.rho)
        if not 0 <= self.rho < 1 or not lo <= self.d_rate <= hi:
            raise ValueError(f"d_rate={self.d_rate} breaks A5 for rho={self.rho}")
        if self.push and (not self.mirror or self.p_ranks != 1):
            raise ValueError("push mode is the mirrored world with one D rank")

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
    # (613,540 states)
    "ranks": Scope(
        "ranks", requests=1, p_ranks=2, d_ranks=1, dups=0, d_crash=False, max_states=2_000_000
    ),
    # two requests on one rank: tombstone order, heap order (1,853,392 states)
    "two": Scope(
        "two", requests=2, p_ranks=1, d_ranks=1, dups=0, d_crash=False, max_states=2_000_000
    ),
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
    # two P ranks, each grant naming 2 consumers while D's one rank sends n = 1: the
    # readers of a transfer-done staged before the grant, or handled after it, decide
    # (no losses or aborts: ``ranks`` has them)
    "ranks-n": Scope(
        "ranks-n",
        requests=1,
        p_ranks=2,
        d_ranks=1,
        dups=0,
        losses=0,
        aborts=False,
        d_crash=False,
        consumers=2,
        max_states=2_000_000,
    ),
    # two requests, P's deadline queue compacted as soon as its stale entries are as many
    # as the live leases (slack -1): a lease that ends while the other is live compacts
    # the queue under it; reads, aborts and a D crash end leases in every order
    "compaction": Scope(
        "compaction",
        requests=2,
        p_ranks=1,
        d_ranks=1,
        dups=0,
        losses=0,
        compaction_slack=-1,
        wakes=True,
        max_states=2_000_000,
    ),
    # D's schedule over two engines that fall out of step (a lost connection; 1,495,574 states)
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
        max_states=2_000_000,
    ),
    # faults: D crashes or pauses past its lease, P restarts, ids are granted again
    # (907,910 states)
    "faults": Scope(
        "faults",
        requests=1,
        p_ranks=1,
        d_ranks=1,
        dups=1,
        d_pause=5,
        p_restarts=1,
        regrants=1,
        max_states=3_000_000,
    ),
    # the router giving up (I17): two P ranks, and the router fails the request for each
    # cause it has (a rank refusing, failing or lost, D unreachable, failed or lost, the
    # deadline), at any instant its cause allows; its aborts are the workers' own rule
    "giveup": Scope(
        "giveup",
        requests=1,
        p_ranks=2,
        d_ranks=1,
        losses=0,
        dups=0,
        router=True,
        max_states=2_000_000,
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


# the gate with drift (A5): D's clock runs at 3/8 of the rate of P's (A5 with rho = 0.5
# allows down to 1/3; huge, so that it shows in the few ticks a lease lives: only the
# ratio matters), and D's ClockOffset ages its one sample by 2 rho / (1 - rho) = 2 s per
# second of D's clock, while the true offset moves 5/3: every value is a multiple of
# 1/64, exact in floats; an ageing of half the rule's falls short
SCOPES["drift"] = SCOPES["gate"].with_(name="drift", rho=0.5, d_rate=0.375)


def turn2_config() -> LeaseConfig:
    """The scope configuration with D's cached lease at ``decoder_kv_blocks_ttl`` = 6
    ticks (not L = 5, so a grant that ignores its ttl shows). T1' and T2' (§2.8) hold on
    the grid as T1 and T2 do, the turn-2 request entering P's queue within a tick."""
    return replace(scope_config(), decoder_kv_blocks_ttl=6.0)


# the turn-2 read (§2.8) under the clock offset and drift of ``drift``, the reader P's
# clock now the one that runs slow: D grants, P heartbeats, reads through the gate with
# D's deadline, sends transfer-done, uses the prefix only after D's OK; P may abort its
# turn-2 request (so a transfer-done can reach D after the lease ended and be NK)
SCOPES["turn2"] = SCOPES["drift"].with_(
    name="turn2", mirror=True, aborts=True, config=turn2_config(), max_states=400_000
)


def push_config() -> LeaseConfig:
    """The scope configuration with E = 5 and D's registration lease at
    ``decoder_kv_blocks_ttl`` = 6 ticks. P's tracker runs at 3/4 of D's rate, so
    P's heartbeats leave every 2 ticks of D's: T2' (§2.8) holds on the grid with a
    heartbeat lost (2 + 2 + 1 < 5), and T1' with P tracking within a tick of the
    registration (1 + 2 + 2 + 1 < 6 at worst)."""
    return replace(scope_config(), lease_extension=5.0, decoder_kv_blocks_ttl=6.0)


# push mode (§2.8, I15, I16): D's one rank registers blocks with P's rank under a lease,
# P heartbeats it on its own clock (3/4 of D's rate: drift rho = 1/4) and WRITEs into
# the blocks; D uses the pushed KV and quarantines a lapsed registration's blocks by
# the real PushRegistrations. P may lose a heartbeat, abort, pause 5 ticks (past the
# lease: its WRITE lands late) or crash (D forgets it at any later instant); D may
# cancel the registration itself. No instant crosses a process (durations only), so
# a clock offset has nothing to act on here; drift acts through P's schedule.
SCOPES["push"] = Scope(
    "push",
    requests=1,
    p_ranks=1,
    d_ranks=1,
    losses=1,
    dups=0,
    d_pause=5,
    mirror=True,
    push=True,
    cancels=1,
    reader_clock=True,
    rho=0.25,
    d_rate=0.75,
    config=push_config(),
    max_states=400_000,  # 93,202 states (docs/verification.md)
)


def _one_tombstone() -> LeaseConfig:
    return replace(scope_config(), tombstone_capacity=1)


#: The quick scopes: what the test suite and the mutation run (tools/mutation_run.py)
#: explore on every change: ``small``, ``small-crash``, ``small-pause``, ``d2``, ``cap``,
#: ``gate`` and push with one fault at a time (``push-pause`` ... ``push-w2``)
#: exhaustively, the others bounded at 3,000 states (their full spaces take minutes;
#: ``turn2``'s 176,925 states 67-250 s, ``push``'s 93,202 79-157 s on a loaded machine).
QUICK: dict[str, Scope] = {
    "small": SCOPES["small"],
    "small-crash": SCOPES["small"].with_(name="small-crash", d_crash=True),
    # D pausing E - 1 = 3 ticks: its first heartbeat after the pause reaches P at the
    # lease's deadline, before the reap (a renewal must not apply then)
    "small-pause": SCOPES["small"].with_(name="small-pause", d_pause=3, losses=0),
    "ranks": SCOPES["ranks"].with_(max_states=3_000),
    "two": SCOPES["two"].with_(max_states=3_000),
    "two-tomb1": SCOPES["two"].with_(name="two-tomb1", config=_one_tombstone(), max_states=3_000),
    "schedule": SCOPES["schedule"].with_(max_states=3_000),
    "faults": SCOPES["faults"].with_(max_states=3_000),
    "d2": SCOPES["d2"],
    "cap": SCOPES["cap"],
    "gate": SCOPES["gate"],
    "drift": SCOPES["drift"].with_(max_states=3_000),
    "turn2": SCOPES["turn2"].with_(max_states=3_000),
    "push": SCOPES["push"].with_(max_states=3_000),
    # push with one fault at a time, exhaustive (1,200-2,700 states each): P pausing past
    # the registration (its WRITE lands late), crashing (then forgotten), aborting; D
    # cancelling the registration itself
    **{
        f"push-{fault}": SCOPES["push"].with_(name=f"push-{fault}", losses=0, **off)
        for fault, off in {
            "pause": {"d_crash": False, "cancels": 0, "aborts": False},
            "crash": {"d_pause": 0, "cancels": 0, "aborts": False},
            "cancel": {"d_pause": 0, "d_crash": False, "aborts": False},
            "abort": {"d_pause": 0, "d_crash": False, "cancels": 0},
        }.items()
    },
    "ranks-n": SCOPES["ranks-n"].with_(max_states=3_000),
    "compaction": SCOPES["compaction"].with_(max_states=3_000),
    # the router's give-ups (I17): every cause within the first instants
    "giveup": SCOPES["giveup"].with_(max_states=3_000),
}
# two writer ranks (P with TP 2) and the pause, exhaustive (10,657 states): D uses the
# pushed KV only after both WRITEs, and each rank that will not write aborts
QUICK["push-w2"] = QUICK["push-pause"].with_(name="push-w2", d_ranks=2)
