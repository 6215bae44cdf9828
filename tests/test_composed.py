"""D's HeartbeatTracker -> wire -> a simulated network -> P's LeaseTables, on one
virtual clock (spec §5 timing assumptions; invariants I6 and I8).

The network delays each notification by up to DELTA, duplicates and reorders
them, and loses heartbeats (at most MAX_LOSSES in a row per engine). With the
stated bounds the timing conditions hold with room to spare:

    T1: R + H + S_D + DELTA + S_P + MAX_LOSSES*H < L      (5+5+1+2+1+5 = 19 < 30)
    T2: H + S_D + DELTA + S_P + MAX_LOSSES*H     < E      (5+1+2+1+5   = 14 < 20)

so while D steps no lease it tracks may expire (I8), and once D stops every
lease is released within E (+ one P step) of the last heartbeat P handled (I6).
"""

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from leaseproto import HeartbeatTracker, LeaseConfig, LeaseTable, Release, ReleaseReason, wire

CFG = LeaseConfig()  # L 30, H 5, E 20
S_D = 1.0  # longest D step
S_P = 1.0  # longest P step
DELTA = 2.0  # longest notification delay
R_MAX = 5.0  # longest router transit
MAX_LOSSES = 1
ENGINES = ("P0", "P1", "P2")
TICK = 0.05


@dataclass
class World:
    rnd: random.Random
    p_dup: float
    p_loss: float
    now: float = 0.0
    tables: dict[str, LeaseTable] = field(
        default_factory=lambda: {e: LeaseTable(CFG) for e in ENGINES}
    )
    tracker: HeartbeatTracker = field(default_factory=lambda: HeartbeatTracker(CFG))
    inflight: list[tuple[float, str, bytes]] = field(default_factory=list)
    inbox: dict[str, list[bytes]] = field(default_factory=lambda: {e: [] for e in ENGINES})
    losses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    next_d: float = 0.0
    next_p: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    # request bookkeeping
    to_track: list[tuple[float, str, str]] = field(default_factory=list)  # (at, engine, id)
    read_at: dict[str, float] = field(default_factory=dict)
    tracked: set[str] = field(default_factory=set)
    releases: list[tuple[str, Release]] = field(default_factory=list)
    last_hb_handled: dict[str, float] = field(default_factory=dict)
    granted_at: dict[str, float] = field(default_factory=dict)
    d_alive: bool = True

    def send(self, engine: str, payload: bytes, *, lossy: bool) -> None:
        if lossy and self.losses[engine] < MAX_LOSSES and self.rnd.random() < self.p_loss:
            self.losses[engine] += 1
            return
        if lossy:
            self.losses[engine] = 0
        copies = 2 if self.rnd.random() < self.p_dup else 1
        for _ in range(copies):
            self.inflight.append((self.now + self.rnd.uniform(0, DELTA), engine, payload))

    def d_step(self) -> None:
        now = self.now
        for at, engine, rid in [x for x in self.to_track if x[0] <= now]:
            self.to_track.remove((at, engine, rid))
            self.tracker.track("d-" + rid, engine_id=engine, remote_req_id=rid, now=now)
            self.tracked.add(rid)
        for rid in [r for r in self.tracked if self.read_at[r] <= now]:
            # D scheduled it and read the blocks: transfer-done rides on the READ
            self.tracker.untrack("d-" + rid)
            self.tracked.discard(rid)
            engine = rid.split("/")[0]
            self.send(engine, wire.encode_transfer_done(rid), lossy=False)
        for engine, ids in self.tracker.due(now=now).items():
            for payload in wire.encode_heartbeat(ids, max_bytes=256):
                self.send(engine, payload, lossy=True)

    def p_step(self, engine: str) -> None:
        now = self.now
        table = self.tables[engine]
        for payload in self.inbox[engine]:
            msg = wire.decode(payload)
            if isinstance(msg, wire.Heartbeat):
                table.renew(msg.ids, now=now)
                for rid in msg.ids:
                    if rid in table:
                        self.last_hb_handled[rid] = now
            elif isinstance(msg, wire.TransferDone):
                out = table.transfer_done(msg.req_id, now=now)
                assert not isinstance(out, wire.Nack)
                if isinstance(out, Release):
                    self.releases.append((engine, out))
        self.inbox[engine].clear()
        self.releases.extend((engine, r) for r in table.expire(now=now))

    def grant(self, engine: str, rid: str) -> None:
        self.tables[engine].grant(rid, now=self.now)
        self.granted_at[rid] = self.now
        self.to_track.append((self.now + self.rnd.uniform(0, R_MAX), engine, rid))
        # a quarter of the requests stay queued on D until it dies
        stuck = self.rnd.random() < 0.25
        self.read_at[rid] = float("inf") if stuck else self.now + self.rnd.uniform(0, 100.0)

    def advance(self, until: float, grants: list[tuple[float, str, str]]) -> None:
        while self.now < until:
            self.now = round(self.now + TICK, 6)
            arrived = [m for m in self.inflight if m[0] <= self.now]
            self.inflight = [m for m in self.inflight if m[0] > self.now]
            for _, engine, payload in sorted(arrived):
                self.inbox[engine].append(payload)
            for engine in ENGINES:
                if self.now >= self.next_p[engine]:
                    while grants and grants[0][0] <= self.now and grants[0][1] == engine:
                        _, e, rid = grants.pop(0)
                        self.grant(e, rid)
                    self.p_step(engine)
                    self.next_p[engine] = self.now + self.rnd.uniform(TICK, S_P)
            if self.d_alive and self.now >= self.next_d:
                self.d_step()
                self.next_d = self.now + self.rnd.uniform(TICK, S_D)


@settings(max_examples=12)
@given(
    seed=st.integers(0, 2**32 - 1),
    p_dup=st.sampled_from([0.0, 0.1, 0.5]),
    p_loss=st.sampled_from([0.0, 0.2, 0.6]),
)
def test_no_premature_expiry_while_d_steps_and_bounded_reclaim_after_it_stops(
    seed: int, p_dup: float, p_loss: float
) -> None:
    rnd = random.Random(seed)
    world = World(rnd, p_dup, p_loss)
    grants = sorted(
        (rnd.uniform(0, 60), rnd.choice(ENGINES), f"{e}/r{i}")
        for i, e in enumerate(rnd.choice(ENGINES) for _ in range(40))
    )
    grants = [(t, rid.split("/")[0], rid) for t, _, rid in grants]
    # phase 1: D alive for 150 s; every request is read by t=160 at the latest
    world.advance(150.0, grants)
    assert not grants
    expired = [r for _, r in world.releases if r.reason is ReleaseReason.EXPIRED]
    assert expired == [], f"I8: leases expired while D tracked them: {expired}"
    transferred = {r.req_id for _, r in world.releases}
    assert transferred >= {rid for rid, at in world.read_at.items() if at + DELTA + S_P < 150.0}
    assert transferred.isdisjoint(world.tracked)
    # phase 2: D dies; what it still tracked must be reclaimed in bound
    stop = world.now
    still = set(world.tracked)
    assert still >= {rid for rid, at in world.read_at.items() if at == float("inf")}
    world.d_alive = False
    world.advance(stop + 60.0, [])
    by_id = {r.req_id: r for _, r in world.releases}
    for rid in still:
        r = by_id[rid]
        assert r.reason is ReleaseReason.EXPIRED
        last = world.last_hb_handled.get(rid)
        if last is None:
            bound = world.granted_at[rid] + CFG.kv_lease_duration + S_P
        else:
            assert r.last_renewal == last
            bound = (
                max(world.granted_at[rid] + CFG.kv_lease_duration, last + CFG.lease_extension) + S_P
            )
        assert r.at <= bound + 1e-9, f"I6: {rid} released at {r.at}, bound {bound}"
        assert r.at >= r.deadline  # and never before its deadline
    assert all(len(t) == 0 for t in world.tables.values()), "every lease released"
    assert len(world.releases) == 40, "I3: each granted lease released exactly once"


def test_without_d_a_lease_ends_at_the_initial_deadline_I5() -> None:
    world = World(random.Random(1), 0.0, 0.0)
    world.d_alive = False
    world.advance(100.0, [(1.0, "P0", "P0/x")])
    ((_, r),) = world.releases
    assert r.reason is ReleaseReason.EXPIRED
    assert world.granted_at["P0/x"] + 30.0 <= r.at <= world.granted_at["P0/x"] + 30.0 + S_P
