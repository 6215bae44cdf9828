"""Unit tests of LeaseTable, rule by rule (spec §8.1-8.5). Invariant ids in names."""

import copy

import pytest

from leaseproto import (
    LateTransfer,
    LeaseConfig,
    LeaseTable,
    LocalProtocolError,
    Release,
    ReleaseReason,
    TransferCounted,
)
from leaseproto.core import rules as R
from leaseproto.core.deadlines import DeadlineQueue
from leaseproto.core.lease import Lease

CFG = LeaseConfig()  # 30 s lease, 5 s interval, 20 s extension


def table(**kw: object) -> LeaseTable:
    return LeaseTable(LeaseConfig(**kw)) if kw else LeaseTable(CFG)  # type: ignore[arg-type]


# -- grant --------------------------------------------------------------------------------
def test_grant_sets_deadline_from_default_or_given_ttl() -> None:
    t = table()
    assert t.grant("a", now=10.0) is None
    assert t.grant("b", now=10.0, ttl=480.0) is None
    assert t.deadline("a") == 40.0
    assert t.deadline("b") == 490.0
    assert len(t) == 2 and "a" in t and "zz" not in t
    assert t.next_deadline() == 40.0


def test_granting_a_live_lease_is_misuse_and_changes_nothing() -> None:
    t = table()
    t.grant("a", now=0.0)
    with pytest.raises(LocalProtocolError, match="live"):
        t.grant("a", now=1.0, ttl=100.0)
    assert t.deadline("a") == 30.0
    assert t.stats.granted == 1


# bad consumers, ttl and now: tests/test_bad_input.py


def test_now_going_backwards_is_misuse() -> None:
    t = table()
    t.grant("a", now=5.0)
    for call in (
        lambda: t.renew(["a"], now=4.0),
        lambda: t.expire(now=4.9),
        lambda: t.transfer_done("a", now=1.0),
        lambda: t.abort("a", now=0.0),
        lambda: t.grant("b", now=4.0),
    ):
        with pytest.raises(LocalProtocolError, match="backwards"):
            call()
    assert t.deadline("a") == 35.0 and "b" not in t


def test_reused_id_after_release_is_a_new_lease() -> None:
    t = table()
    t.grant("a", now=0.0)
    t.abort("a", now=1.0)
    assert t.ended("a") is ReleaseReason.ABORTED
    t.grant("a", now=2.0)
    assert t.deadline("a") == 32.0 and t.ended("a") is None


# -- renew --------------------------------------------------------------------------------
def test_renew_takes_the_max_never_shortens_I1() -> None:
    t = table()
    t.grant("a", now=0.0)  # deadline 30
    assert t.renew(["a"], now=5.0) == 1  # now + 20 = 25 < 30: kept
    assert t.deadline("a") == 30.0
    assert t.renew(["a"], now=15.0) == 1
    assert t.deadline("a") == 35.0
    t.grant("b", now=15.0, ttl=480.0)
    t.renew(["b"], now=16.0)
    assert t.deadline("b") == 495.0  # a long ttl is never cut by a renewal


def test_renew_at_the_deadline_instant_does_not_revive_I2() -> None:
    t = table()
    t.grant("a", now=0.0)
    assert t.renew(["a"], now=30.0) == 0  # now == deadline: already lapsed
    assert t.deadline("a") == 30.0
    assert t.stats.renew_lapsed == 1


def test_renew_just_before_deadline_extends() -> None:
    t = table()
    t.grant("a", now=0.0)
    assert t.renew(["a"], now=29.5) == 1
    assert t.deadline("a") == 49.5


def test_renew_ignores_and_counts_unknown_and_ended_ids_I2() -> None:
    t = table()
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    t.transfer_done("b", now=1.0)
    assert t.renew(["zz", "b", "a", "a"], now=20.0) == 2
    s = t.stats
    assert (s.renew_unknown, s.renew_late, s.renewed) == (1, 1, 2)
    assert "b" not in t and "zz" not in t and t.deadline("b") is None


@pytest.mark.parametrize("kind", [list, tuple, iter, dict.fromkeys, set])
def test_renew_takes_the_ids_as_any_iterable(kind: object) -> None:
    # a generator can be read once: renew must read it once
    t = table()
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    ids = kind(["a", "zz"])  # type: ignore[operator]
    lost: list[str] = []
    assert t.renew(ids, now=20.0, lost=lost) == 1
    assert (t.deadline("a"), t.deadline("b"), lost) == (40.0, 30.0, [])
    assert (t.stats.renewed, t.stats.renew_unknown) == (1, 1)


def test_renew_is_capped_I7() -> None:
    t = table(max_lease_lifetime=60.0)
    t.grant("a", now=0.0)
    for now in (15.0, 30.0, 45.0, 55.0):
        t.renew(["a"], now=now)
    assert t.deadline("a") == 60.0
    assert t.expire(now=59.99) == []
    (r,) = t.expire(now=60.0)
    assert r.reason is ReleaseReason.EXPIRED and r.last_renewal == 55.0


def test_cap_never_shortens_a_longer_ttl() -> None:
    t = table(max_lease_lifetime=60.0)
    t.grant("a", now=0.0, ttl=480.0)
    t.renew(["a"], now=10.0)
    assert t.deadline("a") == 480.0


# -- expire -------------------------------------------------------------------------------
def test_expire_at_exact_deadline_I4() -> None:
    t = table()
    t.grant("a", now=0.0)
    assert t.expire(now=29.999) == []
    (r,) = t.expire(now=30.0)
    assert r == Release("a", ReleaseReason.EXPIRED, 30.0, granted_at=0.0, deadline=30.0)
    assert len(t) == 0 and t.next_deadline() is None
    assert t.stats.released_expired == 1


def test_expire_does_not_depend_on_grant_order_B1() -> None:
    # upstream B1: A renewed at the head of an insertion-ordered map hid a dead B behind it
    t = table()
    t.grant("A", now=0.0)
    t.grant("B", now=1.0)
    for now in (5.0, 10.0, 15.0, 20.0, 25.0, 30.0):
        t.renew(["A"], now=now)
        t.expire(now=now)
    (r,) = t.expire(now=31.0)
    assert r.req_id == "B" and "A" in t
    assert all(d is None or d > 31.0 for d in (t.deadline(x) for x in t.live()))


def test_expire_mixed_ttls_B1() -> None:
    t = table()
    t.grant("X", now=0.0, ttl=480.0)
    t.grant("Y", now=1.0)
    assert [r.req_id for r in t.expire(now=31.0)] == ["Y"]
    assert t.live() == ["X"]


def test_expire_returns_in_deadline_order_and_only_due() -> None:
    t = table()
    t.grant("late", now=0.0, ttl=10.0)
    t.grant("early", now=1.0, ttl=2.0)
    t.grant("never", now=2.0, ttl=100.0)
    t.renew(["late"], now=9.0)  # late -> 29
    got = t.expire(now=40.0)
    assert [(r.req_id, r.deadline) for r in got] == [("early", 3.0), ("late", 29.0)]
    assert t.next_deadline() == 102.0


def test_expire_releases_a_renewed_due_lease_in_deadline_order() -> None:
    # found by the random (dev) profile: a's stale entry (30) came first; its renewed
    # deadline 31 was due too and it was released before c (30): b, a, c
    t = table()
    t.grant("a", now=0.0)
    t.grant("c", now=0.0)
    t.grant("b", now=11.0, ttl=0.5)
    t.renew(["a"], now=11.0)  # a -> 31
    got = t.expire(now=31.0)
    assert [(r.req_id, r.deadline) for r in got] == [("b", 11.5), ("c", 30.0), ("a", 31.0)]


def test_release_order_is_the_tombstone_eviction_order() -> None:
    # the same five calls, observed through a tombstone capacity of 1: only the
    # last released (a, deadline 31) is remembered
    t = table(tombstone_capacity=1)
    t.grant("a", now=0.0)
    t.grant("c", now=0.0)
    t.grant("b", now=11.0, ttl=0.5)
    t.renew(["a"], now=11.0)
    t.expire(now=31.0)
    assert t.ended("a") is ReleaseReason.EXPIRED
    assert t.ended("b") is None and t.ended("c") is None


def test_a_live_lease_survives_queue_compaction() -> None:
    # a _compact that kept the wrong entries would drop the live lease's entry:
    # it would then never expire
    t = table()
    t.grant("live", now=0.0)
    for i in range(3000):
        t.grant(f"r{i}", now=0.0)
        t.transfer_done(f"r{i}", now=0.0)
    assert len(t._queue) <= 1024 + 2  # compaction ran
    assert t.next_deadline() == 30.0
    assert [r.req_id for r in t.expire(now=30.0)] == ["live"]
    assert len(t) == 0


@pytest.mark.parametrize("pop", ["expire", "next_deadline"])
def test_popping_one_stale_entry_does_not_reset_the_stale_count(pop: str) -> None:
    # each round ends 1000 leases behind a live anchor, and pops one stale entry
    # ahead of it; the count must go down by one (max(0, n - 1)), not to zero
    # (min), or compaction never runs and the heap grows without bound
    t = table()
    t.grant("anchor", now=0.0, ttl=1e6)
    for c in range(12):
        now = float(c)
        t.grant(f"x{c}", now=now, ttl=0.1)
        t.abort(f"x{c}", now=now)
        for i in range(1000):
            t.grant(f"y{c}-{i}", now=now, ttl=1e7)
            t.abort(f"y{c}-{i}", now=now)
        if pop == "expire":
            assert t.expire(now=now + 0.2) == []
        else:
            assert t.next_deadline() == 1e6
    assert len(t._queue) <= 2 * 1024 + 2


def test_next_deadline_follows_renewals() -> None:
    t = table()
    t.grant("a", now=0.0)
    t.grant("b", now=1.0)
    t.renew(["a"], now=25.0)  # a -> 45
    assert t.next_deadline() == 31.0
    t.transfer_done("b", now=26.0)
    assert t.next_deadline() == 45.0


def test_many_ended_leases_do_not_grow_the_queue_without_bound() -> None:
    t = table()
    for i in range(5000):
        t.grant(f"r{i}", now=float(i))
        t.transfer_done(f"r{i}", now=float(i))
    assert len(t._queue) <= 1024 + 1  # compacted
    assert t.expire(now=10_000.0) == []


def _check_queue(t: LeaseTable) -> None:
    """The deadline queue's invariants: each live lease has exactly one entry, queued at
    or before its deadline (renewals only move it later); ``stale`` counts the entries
    of leases that left the table (what compaction is decided on)."""
    entries = list(t._queue.entries())
    live = t._leases
    mine = [(d, lease) for d, lease in entries if live.get(lease.req_id) is lease]
    # an entry is stale exactly when its lease ended (what the queue's C-speed paths read)
    assert [lease.state == R.GRANTED for _, lease in entries] == [
        live.get(lease.req_id) is lease for _, lease in entries
    ]
    assert sorted(lease.req_id for _, lease in mine) == sorted(live)
    assert all(d <= lease.deadline for d, lease in mine)
    assert t._queue.stale == len(entries) - len(mine)


def test_the_deadline_queue_is_slotted() -> None:
    # one per table, cloned per branch by the checker: no per-instance dict, and a
    # mistyped counter (the table sets ``stale`` from outside) raises
    q = DeadlineQueue()
    assert not hasattr(q, "__dict__")
    with pytest.raises(AttributeError):
        q.stal = 1  # type: ignore[attr-defined]


def test_the_queue_s_stale_count_is_its_entries_of_ended_leases() -> None:
    t = table()
    for rid in "abcd":
        t.grant(rid, now=0.0)  # one deadline, 30: the queue's order is a, b, c, d
    t.grant("e", now=1.0)
    t.abort("a", now=2.0)
    t.transfer_done("c", now=2.0)
    _check_queue(t)  # two stale entries
    assert t.next_deadline() == 30.0  # drops a's entry, stops at b's
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=30.0)] == ["b", "d"]  # drops c's
    _check_queue(t)
    assert t._queue.stale == 0 and len(t._queue) == 1


def test_a_renewed_lease_met_by_next_deadline_is_released_once() -> None:
    # next_deadline queues a again at its renewed deadline and drops its old entry
    t = table()
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)  # both queued at 30, a first
    t.renew(["a"], now=15.0)  # a -> 35
    assert t.next_deadline() == 30.0
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=30.0)] == ["b"]
    _check_queue(t)
    assert t.next_deadline() == 35.0
    assert [r.req_id for r in t.expire(now=35.0)] == ["a"]
    assert len(t) == 0 and len(t._queue) == 0 and t.next_deadline() is None


@pytest.mark.parametrize("peek", [False, True])
@pytest.mark.parametrize("b_ttl", [None, 29.0])
def test_a_lease_renewed_onto_a_later_grant_s_deadline_goes_first(
    peek: bool, b_ttl: float | None
) -> None:
    # a ties with b at 40 and was granted first: released first, whether the queue moves
    # it when its old deadline comes due (expire) or before (next_deadline), and whether
    # b is in the list of grants or (its own ttl) in the calendar, where a is inserted
    t = table()
    t.grant("a", now=0.0)  # 30
    if b_ttl is None:
        t.grant("b", now=10.0)  # 40
    else:
        t.grant("b", now=11.0, ttl=b_ttl)  # 40, in the calendar
    t.renew(["a"], now=20.0)  # a -> 40
    if peek:
        assert t.next_deadline() == 40.0
    assert t.expire(now=39.0) == []
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=40.0)] == ["a", "b"]
    _check_queue(t)


@pytest.mark.parametrize("peek", [False, True])
def test_a_lease_renewed_onto_an_earlier_grant_s_deadline_goes_after_it(peek: bool) -> None:
    t = table()
    t.grant("b", now=0.0, ttl=40.0)  # granted first
    t.grant("a", now=0.0)  # 30
    t.renew(["a"], now=20.0)  # a -> 40
    if peek:
        assert t.next_deadline() == 40.0
    assert t.expire(now=39.0) == []
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=40.0)] == ["b", "a"]
    assert len(t) == 0


def test_the_queue_is_compacted_once_stale_entries_outnumber_the_live_by_1024() -> None:
    # compaction walks the whole queue: it waits until the stale entries are more than
    # the live leases plus 1024, so its cost is spread over that many ends
    t = table()
    for i in range(10):
        t.grant(f"live{i}", now=0.0)
    for i in range(10 + 1024):
        t.grant(f"x{i}", now=0.0)
        t.abort(f"x{i}", now=0.0)
    assert len(t._queue) == 10 + 10 + 1024 and t._queue.stale == 10 + 1024  # not yet
    t.grant("last", now=0.0)
    t.abort("last", now=0.0)  # one more: compacted
    assert len(t._queue) == 10 and t._queue.stale == 0
    _check_queue(t)
    assert len(t.expire(now=30.0)) == 10


def test_compaction_keeps_the_deadlines_in_heap_order() -> None:
    # the live leases' deadlines were queued latest first; after compaction the
    # earliest must still come first
    t = table()
    for ttl in (100.0, 90.0, 80.0):
        t.grant(f"l{ttl:g}", now=0.0, ttl=ttl)
    for i in range(3 + 1025):
        t.grant(f"x{i}", now=0.0)
        t.abort(f"x{i}", now=0.0)
    assert len(t._queue) == 3  # compacted
    assert t.next_deadline() == 80.0
    assert [r.req_id for r in t.expire(now=85.0)] == ["l80"]
    assert [r.req_id for r in t.expire(now=100.0)] == ["l90", "l100"]


def test_a_copy_of_the_queue_holds_the_same_entries_and_is_independent() -> None:
    # the model checker's clones: remap gives each entry its lease's copy
    t = table()
    for rid in "abc":
        t.grant(rid, now=0.0)
    t.grant("d", now=1.0)
    t.abort("b", now=2.0)  # one stale entry
    q = t._queue
    before = list(q.entries())
    twins: dict[str, Lease] = {}

    def remap(lease: Lease) -> Lease:
        return twins.setdefault(lease.req_id, copy.copy(lease))

    new = q.copy(remap)
    assert [(d, x.req_id) for d, x in new.entries()] == [(d, x.req_id) for d, x in before]
    assert all(x is twins[x.req_id] for _, x in new.entries())
    assert new.stale == q.stale == 1 and len(new) == len(q) == 4
    live = {rid: twins[rid] for rid in "acd"}
    assert [x.req_id for x in new.take_due(30.0, live)] == ["a", "c"]  # b's stale: dropped
    assert new.stale == 0 and new.next_deadline(live) == 31.0
    assert list(q.entries()) == before and q.stale == 1  # the original is untouched
    assert q.next_deadline(t._leases) == 30.0


# -- transfer-done ------------------------------------------------------------------------
def test_transfer_done_releases_with_consumers_I10() -> None:
    t = table()
    t.grant("a", now=0.0, consumers=3)
    assert t.transfer_done("a", now=1.0) == TransferCounted("a", 1.0, done=1, readers=3)
    assert t.transfer_done("a", now=2.0) == TransferCounted("a", 2.0, done=2, readers=3)
    assert t.lease_info("a")["done"] == 2  # type: ignore[index]
    r = t.transfer_done("a", now=3.0)
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED and r.at == 3.0
    # beyond consumers: the blocks may be reused already, so the reader is told (I13)
    late = t.transfer_done("a", now=4.0)
    assert late == LateTransfer("a", ReleaseReason.TRANSFERRED, 4.0, ended_at=3.0)
    assert t.stats.excess_transfers == 1 and t.stats.late_transfers == 0


def test_transfer_done_after_deadline_but_before_reap_still_transfers() -> None:
    t = table()
    t.grant("a", now=0.0)
    r = t.transfer_done("a", now=31.0)  # blocks were never freed: the read was good
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED


@pytest.mark.parametrize("how", ["expire", "abort"])
def test_late_transfer_after_expiry_or_abort(how: str) -> None:
    t = table()
    t.grant("a", now=0.0)
    if how == "expire":
        t.expire(now=30.0)
        ended = ReleaseReason.EXPIRED
    else:
        t.abort("a", now=30.0)
        ended = ReleaseReason.ABORTED
    late = t.transfer_done("a", now=31.0)
    assert late == LateTransfer("a", ended, 31.0, ended_at=30.0)
    assert t.stats.late_transfers == 1


def test_early_transfer_is_staged_and_applied_on_grant_B7() -> None:
    t = table()
    assert t.transfer_done("a", now=0.0) is None
    assert t.stats.early_staged == 1 and len(t) == 0
    r = t.grant("a", now=0.5)
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED
    assert len(t) == 0 and t.stats.early_applied == 1


def test_early_transfers_count_towards_consumers() -> None:
    t = table()
    t.transfer_done("a", now=0.0)
    assert t.grant("a", now=1.0, consumers=2) is None
    assert t.lease_info("a")["done"] == 1  # type: ignore[index]
    r = t.transfer_done("a", now=2.0)
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED


def test_staging_is_bounded_in_time_and_count() -> None:
    t = table(staging_ttl=5.0, staging_capacity=2)
    t.transfer_done("a", now=0.0)
    t.transfer_done("b", now=1.0)
    t.transfer_done("c", now=2.0)  # evicts a
    assert t.stats.early_dropped == 1
    assert t.grant("a", now=3.0) is None  # nothing staged any more
    t.expire(now=6.0)  # b is 5 s old: dropped
    assert t.grant("b", now=6.0) is None
    r = t.grant("c", now=6.5)
    assert isinstance(r, Release)
    assert t.stats.early_dropped == 2


def test_with_no_staging_an_early_notification_is_dropped_and_counted() -> None:
    t = table(staging_capacity=0)
    assert t.transfer_done("a", now=0.0) is None
    assert t.abort("b", now=0.0) is None
    s = t.stats
    assert (s.early_dropped, s.early_staged) == (2, 0)
    assert t.grant("a", now=1.0) is None and t.grant("b", now=1.0) is None  # nothing applied
    assert t.live() == ["a", "b"] and t.stats.early_applied == 0


def test_tombstones_are_bounded_in_time_and_count() -> None:
    t = table(tombstone_ttl=10.0, tombstone_capacity=2)
    for rid in ("a", "b", "c"):
        t.grant(rid, now=0.0)
        t.abort(rid, now=0.0)
    assert t.ended("a") is None and t.ended("c") is ReleaseReason.ABORTED
    t.expire(now=10.0)
    assert t.ended("c") is None
    # a forgotten lease's late notification is then staged as unknown
    assert t.transfer_done("c", now=11.0) is None and t.stats.early_staged == 1


# -- abort --------------------------------------------------------------------------------
def test_abort_releases_at_once_and_only_once_I3() -> None:
    t = table()
    t.grant("a", now=0.0)
    r = t.abort("a", now=3.0)
    assert r is not None and r.reason is ReleaseReason.ABORTED and r.at == 3.0
    assert t.abort("a", now=4.0) is None
    assert t.expire(now=100.0) == []
    s = t.stats
    assert (s.released_aborted, s.late_aborts, s.released_expired) == (1, 1, 0)


def test_abort_before_grant_releases_on_grant_B8() -> None:
    t = table()
    assert t.abort("a", now=0.0) is None
    r = t.grant("a", now=1.0)
    assert r is not None and r.reason is ReleaseReason.ABORTED


def test_repr_and_stats_live() -> None:
    t = table()
    t.grant("a", now=0.0)
    assert "live=1" in repr(t) and t.stats.live == 1


def test_renew_reports_lost_leases_for_nacks() -> None:
    t = table()
    for rid in ("exp", "abt", "xfer", "lapsed"):
        t.grant(rid, now=0.0)
    t.abort("abt", now=1.0)
    t.transfer_done("xfer", now=1.0)
    t.renew(["lapsed"], now=15.0)  # -> 35
    t.grant("live", now=20.0)
    t.expire(now=30.0)  # exp ends
    lost: list[str] = []
    n = t.renew(["exp", "abt", "xfer", "lapsed", "live", "unknown"], now=36.0, lost=lost)
    assert n == 1  # only "live"
    assert lost == ["exp", "abt", "lapsed"]  # lapsed: 35 <= 36, not reaped yet
    assert "lapsed" in t  # reporting does not end it: the reaper does


def test_pruning_forgets_only_the_tombstones_past_their_ttl() -> None:
    t = table(tombstone_ttl=10.0)
    t.grant("old", now=0.0)
    t.grant("new", now=0.0)
    t.abort("old", now=0.0)
    t.abort("new", now=5.0)
    assert t.expire(now=10.0) == []  # old's tombstone is 10 s old: forgotten
    assert t.ended("old") is None
    assert t.ended("new") is not None  # 5 s old: kept


# -- the list of grants (deadlines.py: leases granted for the default ttl) -----------------
def test_grants_at_one_instant_all_stay_in_the_list_of_grants() -> None:
    # equal deadlines keep the list sorted: none is sent to the calendar (a heap push
    # and a bucket each), which only grants before the latest one's deadline need
    t = table()
    for i in range(3):
        t.grant(f"r{i}", now=5.0)
    q = t._queue
    assert [lease.req_id for lease in q._grants] == ["r0", "r1", "r2"]
    assert q._buckets == {} and q._keys == []
    assert [r.req_id for r in t.expire(now=35.0)] == ["r0", "r1", "r2"]


@pytest.mark.parametrize(
    ("taken", "n", "trimmed"), [(1023, 2046, False), (1024, 2048, True), (1024, 3000, False)]
)
def test_the_taken_part_of_the_list_of_grants_is_dropped_once_it_is_1024_and_half(
    taken: int, n: int, trimmed: bool
) -> None:
    # the list is cut (a copy of what is left) only once the taken prefix is at least
    # 1,024 entries and half the list, so the cut's cost is spread over as many takes,
    # and the list stays within twice the grants not yet due
    t = table()
    for i in range(n):
        t.grant(f"r{i}", now=i / 1024)  # exact in binary: deadlines 30 + i / 1024
    got = t.expire(now=30.0 + (taken - 1) / 1024)
    assert len(got) == taken
    q = t._queue
    assert (len(q._grants), q._head) == ((n - taken, 0) if trimmed else (n, taken))
    # the first grant not taken is the next one due, exactly: take_due skips the list
    # until then
    assert q._first == 30.0 + taken / 1024
    assert t.next_deadline() == 30.0 + taken / 1024
    assert [r.req_id for r in t.expire(now=30.0 + taken / 1024)] == [f"r{taken}"]
    _check_queue(t)


def test_grants_renewed_alike_are_queued_again_once_each() -> None:
    # a heartbeat renews an engine's leases to one deadline: met in the list of
    # grants, they go into the calendar together, each with exactly one entry
    t = table()
    for r in ("a", "b", "c"):
        t.grant(r, now=0.0)
    assert t.renew(["a", "b", "c"], now=15.0) == 3  # all to 35
    assert t.expire(now=30.0) == []
    _check_queue(t)
    assert [lease.req_id for _, lease in t._queue.entries()] == ["a", "b", "c"]
    assert [r.req_id for r in t.expire(now=35.0)] == ["a", "b", "c"]


def test_stale_grants_dropped_from_the_list_are_counted_off_once_each() -> None:
    # b's entry in the list and d's in the calendar are stale; taking the list's due
    # part drops b's (and only b's) from the count
    t = table()
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    t.grant("c", now=0.0)
    t.grant("d", now=0.0, ttl=40.0)  # not the default ttl: in the calendar
    t.abort("b", now=1.0)
    t.abort("d", now=1.0)
    assert t._queue.stale == 2
    assert t.renew(["c"], now=15.0) == 1  # c renewed: it leaves the list for the calendar
    assert [r.req_id for r in t.expire(now=30.0)] == ["a"]
    assert t._queue.stale == 1  # d's
    _check_queue(t)


def test_an_early_transfer_still_within_staging_ttl_outlives_an_older_one() -> None:
    # the prune at a's staging deadline drops a alone: b, staged later, still counts
    t = table(staging_ttl=5.0)
    t.transfer_done("a", now=0.0)
    t.transfer_done("b", now=2.0)
    t.expire(now=5.0)  # a is 5 s old: dropped
    assert t.stats.early_dropped == 1
    r = t.grant("b", now=6.5)  # b is 4.5 s old: applied
    assert isinstance(r, Release) and r.reason is ReleaseReason.TRANSFERRED


def test_stale_calendar_entries_met_are_counted_off_and_removed() -> None:
    # a and b share a calendar bucket (ttl 40, not the default); a ended: the walk of
    # next_deadline and the take of expire each drop a's entry and count it off
    for walk in (True, False):
        t = table()
        t.grant("a", now=0.0, ttl=40.0)
        t.grant("b", now=0.0, ttl=40.0)
        t.abort("a", now=1.0)
        assert t._queue.stale == 1
        if walk:
            assert t.next_deadline() == 40.0
            assert [lease.req_id for _, lease in t._queue.entries()] == ["b"]
        else:
            assert [r.req_id for r in t.expire(now=40.0)] == ["b"]
        assert t._queue.stale == 0
        _check_queue(t)


def test_the_next_prune_is_when_the_oldest_kept_entry_is_too_old() -> None:
    # after a prune, the table's next one is due exactly when the oldest tombstone or
    # staged notification left reaches its ttl (earlier would prune for nothing)
    t = table(tombstone_ttl=10.0, staging_ttl=5.0)
    t.grant("x", now=0.0)
    t.abort("x", now=0.0)  # a tombstone until 10
    assert t._prune_at == 10.0
    t.transfer_done("s1", now=3.0)  # staged until 8
    assert t._prune_at == 8.0
    t.transfer_done("s2", now=4.0)  # staged until 9
    t.expire(now=8.0)  # prunes s1
    assert t.stats.early_dropped == 1
    assert t._prune_at == 9.0  # s2's
    t.expire(now=9.0)  # prunes s2
    assert t._prune_at == 10.0  # x's tombstone


def test_a_lease_record_reads_one_consumer_and_one_reader_by_default() -> None:
    lease = Lease("a", 0.0, 30.0, seq=0)
    assert lease.counts is None
    assert (lease.consumers, lease.readers, lease.done) == (1, 1, 0)
    t = table()
    t.grant("a", now=0.0)
    info = t.lease_info("a")
    assert info is not None and (info["consumers"], info["readers"], info["done"]) == (1, 1, 0)


def test_a_calendar_bucket_emptied_by_next_deadline_takes_a_later_grant_at_its_deadline() -> None:
    # next_deadline finds every entry of the bucket at 3 stale: the bucket goes with its
    # heap key, so a lease granted later for the same deadline gets a key again and is
    # reaped there (a bucket left behind without its key would hide it for ever)
    t = table()
    for r in ("a", "b"):
        t.grant(r, now=0.0, ttl=3.0)
        t.abort(r, now=0.0)
    assert t.next_deadline() is None
    t.grant("c", now=0.0, ttl=3.0)
    assert t.next_deadline() == 3.0
    assert [r.req_id for r in t.expire(now=3.0)] == ["c"]
    _check_queue(t)


@pytest.mark.parametrize("part", ["grants", "calendar"])
def test_two_leases_renewed_alike_are_requeued_as_one_group(
    part: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a heartbeat renews an engine's leases to one deadline: met in the list of grants
    # or in a calendar bucket, two or more of them go back into the calendar as one
    # group (``_requeue_all``, at C speed), not one by one
    calls: list[list[str]] = []
    real = DeadlineQueue._requeue_all

    def spy(self: DeadlineQueue, leases: list[Lease]) -> bool:
        calls.append([x.req_id for x in leases])
        return real(self, leases)

    monkeypatch.setattr(DeadlineQueue, "_requeue_all", spy)
    t = table()
    for r in ("a", "b"):
        t.grant(r, now=0.0, **({"ttl": 3.0} if part == "calendar" else {}))
    # both renewed to one later deadline: 35 (granted to 30) or 21 (granted to 3)
    assert t.renew(["a", "b"], now=15.0 if part == "grants" else 1.0) == 2
    assert t.expire(now=30.0 if part == "grants" else 3.0) == []
    assert calls == [["a", "b"]]
    _check_queue(t)


def test_a_clean_bucket_is_taken_whole() -> None:
    # take_due's C-speed path: a bucket of at least _WHOLE live leases, all still due
    # at its deadline, is clean; an ended or renewed lease in it makes it not clean
    from leaseproto.core.deadlines import _WHOLE, _clean

    t = table()
    for i in range(_WHOLE):
        t.grant(f"r{i}", now=0.0, ttl=3.0)
    bucket = list(t._queue._buckets[3.0])
    assert len(bucket) == _WHOLE and _clean(bucket, 3.0) is True
    t.abort("r0", now=0.5)
    assert _clean(bucket, 3.0) is False
    t2 = table()
    for i in range(_WHOLE):
        t2.grant(f"r{i}", now=0.0, ttl=3.0)
    t2.renew(["r3"], now=1.0)
    assert _clean(list(t2._queue._buckets[3.0]), 3.0) is False
    assert len(t2.expire(now=3.0)) == _WHOLE - 1


def test_compaction_keeps_the_live_leases_of_a_bucket_and_only_them() -> None:
    # one calendar bucket (deadline 3) holds a live lease and many ended ones; once the
    # stale entries pass live + 1024 the table compacts: the bucket keeps only its live
    # lease and the stale count starts again from the entries left
    t = table()
    t.grant("keep", now=0.0, ttl=3.0)
    for i in range(1100):
        t.grant(f"r{i}", now=0.0, ttl=3.0)
        t.transfer_done(f"r{i}", now=0.0)
    assert len(t._queue) < 1100  # compacted once, at the 1,026th ended lease
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=3.0)] == ["keep"]
    _check_queue(t)
    assert len(t._queue) == 0


def test_compaction_keeps_the_grants_after_the_list_s_head() -> None:
    # the list of grants (default lease) has had its head taken (g0 expired) when the
    # table compacts: the list that is left starts at g1, read from its start
    t = table()
    for i in range(3):
        t.grant(f"g{i}", now=float(i))  # deadlines 30, 31, 32
    assert [r.req_id for r in t.expire(now=30.0)] == ["g0"]
    for i in range(1100):
        t.grant(f"r{i}", now=30.0, ttl=3.0)
        t.transfer_done(f"r{i}", now=30.0)
    _check_queue(t)
    assert t.next_deadline() == 31.0
    assert [r.req_id for r in t.expire(now=32.0)] == ["g1", "g2"]
    _check_queue(t)


def test_a_bucket_whose_first_lease_alone_was_renewed_releases_the_other_on_time() -> None:
    # a and b share the calendar bucket at 3; only a (the bucket's first) is renewed: the
    # bucket is not one group renewed alike, so b is still released at 3 and a later
    t = table()
    for r in ("a", "b"):
        t.grant(r, now=0.0, ttl=3.0)
    assert t.renew(["a"], now=1.0) == 1  # a -> 21
    assert [r.req_id for r in t.expire(now=3.0)] == ["b"]
    _check_queue(t)
    assert [r.req_id for r in t.expire(now=21.0)] == ["a"]


def test_a_clean_bucket_of_eight_is_checked_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # a spy: a bucket of at least eight live leases due at its deadline is checked whole
    # (``_clean``, at C speed) and taken whole; a shorter one goes through the loop
    from leaseproto.core import deadlines

    calls: list[int] = []
    real = deadlines._clean

    def spy(bucket: list[Lease], d: float) -> bool:
        calls.append(len(bucket))
        return real(bucket, d)

    monkeypatch.setattr(deadlines, "_clean", spy)
    t = table()
    for i in range(8):
        t.grant(f"r{i}", now=0.0, ttl=3.0)
    for i in range(7):
        t.grant(f"s{i}", now=0.0, ttl=4.0)
    assert len(t.expire(now=3.0)) == 8 and calls == [8]
    assert len(t.expire(now=4.0)) == 7 and calls == [8]


def test_next_deadline_pops_an_emptied_bucket_s_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # a spy: a bucket next_deadline finds all stale leaves with its key popped off the
    # heap, not by rebuilding the heap (the rebuild is for a key queued below it)
    from leaseproto.core import deadlines

    rebuilt: list[int] = []
    real = deadlines.heapq.heapify
    monkeypatch.setattr(deadlines.heapq, "heapify", lambda h: (rebuilt.append(len(h)), real(h)))
    t = table()
    for r in ("a", "b"):
        t.grant(r, now=0.0, ttl=3.0)
        t.abort(r, now=0.0)
    t.grant("c", now=0.0, ttl=5.0)
    assert t.next_deadline() == 5.0
    assert rebuilt == []
    _check_queue(t)


def test_a_copy_of_the_deadline_queue_answers_as_the_original_and_apart_from_it() -> None:
    """``DeadlineQueue.copy`` (the model checker clones a table per branch): the
    copy names the same deadlines for the remapped leases, and what one of them
    takes is not taken from the other (mutation run 2026-12-06: the copy's bucket
    keys or buckets left out)."""
    t = LeaseTable(LeaseConfig(kv_lease_duration=5.0, heartbeat_interval=1.0, lease_extension=4.0))
    t.grant("a", now=0.0)
    t.grant("b", now=1.0)
    t.renew(["a"], now=3.0)
    assert not t.expire(now=5.0)  # a's grant entry requeued into a calendar bucket (7.0)
    q = t._queue
    assert q._buckets and q._keys  # b's entry is still in the list of grants
    twins = {id(lease): copy.copy(lease) for lease in t._leases.values()}
    c = q.copy(lambda lease: twins[id(lease)])
    twin_live = {lease.req_id: lease for lease in twins.values()}
    assert [(d, lease.req_id) for d, lease in c.entries()] == [
        (d, lease.req_id) for d, lease in q.entries()
    ]
    assert {id(lease) for _, lease in c.entries()} <= {id(x) for x in twins.values()}
    assert c.next_deadline(twin_live) == q.next_deadline(t._leases) == 6.0
    assert [x.req_id for x in c.take_due(6.0, twin_live)] == ["b"]
    del twin_live["b"]
    assert c.next_deadline(twin_live) == 7.0  # a's renewal: 3.0 + 4.0
    assert [x.req_id for x in c.take_due(7.0, twin_live)] == ["a"]
    assert sorted(lease.req_id for _, lease in q.entries()) == ["a", "b"]  # untouched
    assert q.next_deadline(t._leases) == 6.0


def test_a_lease_record_is_slotted() -> None:
    """A live lease's record is the largest part of its memory (docs/performance.md):
    no per-instance ``__dict__`` (mutation run 2026-12-06: ``__slots__`` deleted)."""
    lease = Lease("a", 0.0, 5.0, seq=0)
    assert not hasattr(lease, "__dict__")
    with pytest.raises(AttributeError):
        lease.deadlin = 1.0  # type: ignore[attr-defined]


# Tests for the survivors of the full mutation run of 2026-12-06 (docs/mutation.md).


def _cfg(**kw: float) -> LeaseConfig:
    return LeaseConfig(
        **{"kv_lease_duration": 5.0, "heartbeat_interval": 1.0, "lease_extension": 6.0, **kw}
    )


def test_grants_renewed_alike_requeue_as_a_group_and_the_fresh_one_still_expires() -> None:
    """Three grants due at one instant, two renewed to one deadline: the fresh one
    is released on time and the two at their renewal (``_take_grants``'s group
    path returned ``None`` instead of the fresh grants)."""
    t = LeaseTable(_cfg())
    for r in ("a", "b", "c"):
        t.grant(r, now=0.0)
    t.renew(["a", "c"], now=1.0)  # 7.0 both
    assert t.expire(now=5.0).ids == ["b"]
    assert t.next_deadline() == 7.0
    assert t.expire(now=7.0).ids == ["a", "c"]


def test_grants_renewed_to_different_deadlines_each_go_to_their_own() -> None:
    """Renewed grants whose deadlines differ go into the calendar one group per
    deadline, each lease in its group (``group.append`` deleted lost the second
    lease renewed to a deadline already grouped: never released)."""
    t = LeaseTable(_cfg())
    for r in ("a", "b", "c"):
        t.grant(r, now=0.0)
    t.renew(["a", "c"], now=1.0)  # 7.0
    t.renew(["b"], now=2.0)  # 8.0
    assert t.expire(now=5.0).ids == []
    assert t.expire(now=7.0).ids == ["a", "c"]
    assert t.expire(now=8.0).ids == ["b"]
    assert t.live() == [] and t.next_deadline() is None


def test_a_lease_moved_back_below_its_bucket_is_found_first() -> None:
    """``next_deadline`` meets a lease whose deadline moved back (no rule of the
    table does that today; the queue allows it) when its old bucket comes up: it is
    requeued below, the emptied bucket's key removed from the middle of the heap
    and the heap restored, so every later bucket still comes out in order
    (``keys.remove`` or ``heapify`` deleted: a bucket skipped, its lease taken late).
    The deadlines were found by a search over random heaps for one that the
    missing ``heapify`` breaks."""
    q = DeadlineQueue()
    deadlines = (17.0, 30.0, 15.0, 27.0, 28.0, 37.0, 12.0, 36.0, 18.0)
    leases = {f"r{i}": Lease(f"r{i}", 0.0, d, seq=i) for i, d in enumerate(deadlines)}
    for lease in leases.values():
        q.push(lease)
    leases["r0"].deadline = 2.0  # moved back from 17
    order = []
    while (d := q.next_deadline(leases)) is not None:
        order.append(d)
        for lease in q.take_due(d, leases):
            assert lease.deadline == d
            del leases[lease.req_id]
    assert order == [12.0, 15.0, 2.0, 18.0, 27.0, 28.0, 30.0, 36.0, 37.0] and not leases


def test_a_grant_whose_cap_instant_overflows_is_refused() -> None:
    """``now + max_lease_lifetime`` must be finite as the deadline must
    (``cap_at < inf`` made ``<=``: an infinite cap accepted)."""
    t = LeaseTable(_cfg(max_lease_lifetime=1e308))
    with pytest.raises(LocalProtocolError, match="finite"):
        t.grant("a", now=1.7e308)
    assert t.live() == []
