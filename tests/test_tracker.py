import math

import pytest

from leaseproto import HeartbeatTracker, LeaseConfig, LocalProtocolError, wire

CFG = LeaseConfig()  # interval 5 s


def test_first_heartbeat_is_due_at_once_then_every_interval_I11() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", remote_req_id="p1", now=0.0)
    assert t.due(now=0.0) == {"P0": ["p1"]}
    assert t.due(now=4.999) == {}
    assert t.due(now=5.0) == {"P0": ["p1"]}
    assert t.next_due() == 10.0


def test_batches_per_engine_with_remote_ids() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", remote_req_id="p1", now=0.0)
    t.track("d2", engine_id="P1", now=0.0)
    t.track("d3", engine_id="P0", remote_req_id="p3", now=0.0)
    assert t.due(now=0.0) == {"P0": ["p1", "p3"], "P1": ["d2"]}
    assert t.engines() == ["P0", "P1"] and t.requests("P0") == ["d1", "d3"]
    assert t.remote_id("d3") == "p3" and t.engine_of("d2") == "P1"


def test_two_requests_naming_one_remote_id_are_heartbeated_once_until_both_stop() -> None:
    """Spec §7.2: duplicates are sent once, ids in tracking order; the heartbeat goes on
    while any tracked request names the id. due()'s lists hold each id once, so
    payloads() drops no repeats from them."""
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", remote_req_id="p1", now=0.0)
    t.track("d2", engine_id="P0", remote_req_id="p2", now=0.0)
    t.track("d3", engine_id="P0", remote_req_id="p1", now=0.0)
    due = t.due(now=0.0)
    assert due == {"P0": ["p1", "p2"]} and t.stats.heartbeat_ids == 2
    assert t.payloads(due["P0"]) == [b"HB:p1,p2"]
    assert t.requests("P0") == ["d1", "d2", "d3"] and t.remote_id("d3") == "p1"
    t.untrack("d1")  # d3 still needs p1's lease
    assert t.due(now=5.0) == {"P0": ["p1", "p2"]}
    t.untrack("d3")
    assert t.due(now=10.0) == {"P0": ["p2"]}
    assert t.drop_engine("P0") == ["d2"] and t.engines() == [] and len(t) == 0


def test_pending_engine_keeps_its_turn() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    assert t.due(now=0.0, pending={"P0"}) == {}
    assert t.due(now=0.1, pending={"P0"}) == {}
    # handshake completes: sent on the very next step, not an interval later
    assert t.due(now=0.2) == {"P0": ["d1"]}
    assert t.stats.deferred == 2


def test_pending_engine_does_not_block_others() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.track("d2", engine_id="P1", now=0.0)
    assert t.due(now=0.0, pending=["P0"]) == {"P1": ["d2"]}


def test_untrack_stops_heartbeats_and_forgets_empty_engines() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.track("d2", engine_id="P0", now=0.0)
    t.due(now=0.0)
    t.untrack("d1")
    t.untrack("unknown")  # no-op
    assert t.due(now=5.0) == {"P0": ["d2"]}
    t.untrack("d2")
    assert t.engines() == [] and t.due(now=10.0) == {} and t.next_due() is None
    # an engine seen again starts fresh: due at once
    t.track("d3", engine_id="P0", now=10.5)
    assert t.due(now=10.5) == {"P0": ["d3"]}


def test_drop_engine_returns_its_requests() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.track("d2", engine_id="P1", now=0.0)
    assert t.drop_engine("P0") == ["d1"]
    assert "d1" not in t and "d2" in t and len(t) == 1
    assert t.drop_engine("nope") == []
    assert t.stats.dropped == 1


def test_track_twice_and_time_going_back_are_misuse() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=1.0)
    with pytest.raises(LocalProtocolError, match="already tracked"):
        t.track("d1", engine_id="P1", now=2.0)
    with pytest.raises(LocalProtocolError, match="backwards"):
        t.due(now=0.5)
    assert t.engine_of("d1") == "P0"


def test_a_step_with_nothing_due_still_moves_the_clock() -> None:
    """``now`` of a step that sends nothing is the new last ``now``: an earlier
    one after it is refused, by ``due`` and by ``track``."""
    t = HeartbeatTracker(CFG)  # interval 5
    t.track("d1", engine_id="P0", now=0.0)
    assert t.due(now=0.0) == {"P0": ["d1"]}
    assert t.due(now=2.0) == {}
    with pytest.raises(LocalProtocolError, match="backwards"):
        t.due(now=1.0)
    with pytest.raises(LocalProtocolError, match="backwards"):
        t.track("d2", engine_id="P0", now=1.5)
    assert "d2" not in t and t.due(now=2.0) == {}


@pytest.mark.parametrize("now", ["1.0", None, [1.0]])
def test_a_now_that_is_not_a_number_is_misuse(now: object) -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.due(now=0.0)
    with pytest.raises(LocalProtocolError, match="now"):
        t.track("d2", engine_id="P0", now=now)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="now"):
        t.due(now=now)  # type: ignore[arg-type]
    assert "d2" not in t and t.due(now=5.0) == {"P0": ["d1"]}


def test_a_local_id_that_is_not_a_str_is_misuse() -> None:
    t = HeartbeatTracker(CFG)
    with pytest.raises(LocalProtocolError, match="must be a str"):
        t.track(7, engine_id="P0", remote_req_id="r7", now=0.0)  # type: ignore[arg-type]
    assert len(t) == 0 and t.engines() == []


def test_stats_count_heartbeats_and_ids() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.track("d2", engine_id="P0", now=0.0)
    t.due(now=0.0)
    t.due(now=5.0)
    s = t.stats
    assert (s.heartbeats, s.heartbeat_ids, s.live, s.engines, s.tracked) == (2, 4, 2, 1, 2)


def test_stats_split_what_was_tracked_into_untracked_dropped_and_live() -> None:
    t = HeartbeatTracker(CFG)
    for k in range(4):
        t.track(f"d{k}", engine_id="P0" if k < 3 else "P1", now=0.0)
    t.untrack("d0")
    assert t.drop_engine("P0") == ["d1", "d2"]
    s = t.stats
    assert (s.tracked, s.untracked, s.dropped, s.live, s.engines) == (4, 1, 2, 1, 1)
    assert s.tracked == s.untracked + s.dropped + s.live


def _holding(t: HeartbeatTracker, engine: str) -> list[str]:
    """The tracker's maps that still have ``engine`` as a key."""
    return [name for name, v in vars(t).items() if isinstance(v, dict) and engine in v]


def test_a_forgotten_engine_leaves_nothing_behind() -> None:
    """Engines come and go for the life of a D worker: what the tracker keeps per
    engine must go with the engine's last request (untrack) or with the engine
    (drop_engine), or the tracker grows without bound."""
    t = HeartbeatTracker(CFG)
    for k in range(3):
        t.track(f"d{k}", engine_id=f"P{k}", now=0.0)
    assert all(_holding(t, f"P{k}") for k in range(3))
    t.due(now=0.0, pending={"P2"})  # P0, P1 sent to; P2 still waiting for its first
    t.untrack("d0")
    assert t.drop_engine("P1") == ["d1"]
    t.untrack("d2")
    assert t.engines() == []
    assert {f"P{k}": _holding(t, f"P{k}") for k in range(3)} == {"P0": [], "P1": [], "P2": []}


def test_next_due_is_minus_inf_for_a_new_engine() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    assert t.next_due() == -math.inf


def test_next_due_is_the_earliest_engine_not_the_latest() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    assert t.due(now=0.0) == {"P0": ["d1"]}
    t.track("d2", engine_id="P1", now=2.0)
    assert t.due(now=2.0) == {"P1": ["d2"]}
    assert t.next_due() == 5.0  # P0's turn (0 + 5) comes before P1's (2 + 5)
    t.track("d3", engine_id="P2", now=3.0)
    assert t.next_due() == -math.inf  # P2 never had one: due now


# -- the tracker against a naive schedule (every engine checked every step) -------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from leaseproto.core import rules as R  # noqa: E402

_due = st.tuples(
    st.just("due"),
    st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.49, 0.5, 0.51, 1.0]),
    st.sampled_from(["", "", "", "A", "B", "AB"]),
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("track"), st.integers(0, 5), st.sampled_from("ABC")),
        _due,
        _due,
        st.tuples(st.just("untrack"), st.integers(0, 5), st.just("")),
        st.tuples(st.just("drop"), st.just(0), st.sampled_from("ABC")),
    ),
    min_size=5,
    max_size=60,
)


def test_engines_with_different_last_heartbeats_each_get_their_turn() -> None:
    t = HeartbeatTracker(LeaseConfig(kv_lease_duration=3.0))  # interval 0.5
    t.track("a", engine_id="A", now=0.0)
    assert t.due(now=0.0) == {"A": ["a"]}
    t.track("b", engine_id="B", now=0.3)
    assert t.due(now=0.3) == {"B": ["b"]}
    assert t.due(now=0.6) == {"A": ["a"]}  # A is due although B is not
    assert t.due(now=0.7) == {}
    assert t.due(now=0.8) == {"B": ["b"]}


def test_due_returns_the_engines_in_the_order_they_were_first_tracked() -> None:
    """Never-sent engines are found apart from the sent ones; the step still
    returns every due engine in tracking order, as a full scan would."""
    t = HeartbeatTracker(CFG)  # interval 5
    t.track("a", engine_id="A", now=0.0)
    assert t.due(now=0.0) == {"A": ["a"]}
    t.track("b", engine_id="B", now=1.0)
    t.track("c", engine_id="C", now=1.0)
    assert list(t.due(now=5.0).items()) == [("A", ["a"]), ("B", ["b"]), ("C", ["c"])]
    # two due engines as well: C's successor D never sent, A due again
    t.untrack("b")
    t.untrack("c")
    t.track("d", engine_id="D", now=6.0)
    assert list(t.due(now=10.0).items()) == [("A", ["a"]), ("D", ["d"])]


def test_the_threshold_is_the_first_float_at_which_the_oldest_engine_is_due() -> None:
    """``_threshold`` (the bound below which ``due`` answers without a scan):
    +inf with no engine, -inf while an engine never had a heartbeat, else the
    smallest float at which the rule makes the oldest engine due."""
    t = HeartbeatTracker(LeaseConfig(kv_lease_duration=3.0))  # interval 0.5
    assert t._threshold() == math.inf
    t.track("a", engine_id="A", now=0.0)
    assert t._threshold() == -math.inf
    t.due(now=0.1)
    t.track("b", engine_id="B", now=0.2)
    t.due(now=0.2)
    thr = t._threshold()
    assert R.heartbeat_due(0.1, thr, 0.5)
    assert not R.heartbeat_due(0.1, math.nextafter(thr, -math.inf), 0.5)
    assert t.due(now=math.nextafter(thr, -math.inf)) == {}
    assert t.due(now=thr) == {"A": ["a"]}
    # 1.48 + 5.0 rounds up past the first float at which 1.48 is 5 s old, 3.7 + 5.0
    # rounds down to a float at which 3.7 is not 5 s old yet
    for last, side in ((1.48, -1), (3.7, 1)):
        t = HeartbeatTracker(CFG)
        t.track("a", engine_id="A", now=last)
        t.due(now=last)
        thr = t._threshold()
        assert (thr - (last + 5.0)) * side > 0 and R.heartbeat_due(last, thr, 5.0)
        assert not R.heartbeat_due(last, math.nextafter(thr, -math.inf), 5.0)


def test_a_step_before_the_threshold_does_not_ask_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The point of the threshold: a step before it (the same ``now`` as the
    last step included) answers without calling ``heartbeat_due``."""
    asked: list[float] = []
    rule = R.heartbeat_due

    def counting(last: float, now: float, interval: float) -> bool:
        asked.append(now)
        return rule(last, now, interval)

    monkeypatch.setattr(R, "heartbeat_due", counting)  # before the tracker derives a threshold
    t = HeartbeatTracker(CFG)  # interval 5
    t.track("a", engine_id="A", now=0.0)
    t.track("b", engine_id="B", now=0.0)
    assert t.due(now=0.0) == {"A": ["a"], "B": ["b"]}
    asked.clear()
    for now in (0.0, 1.0, 4.9, 4.9):
        assert t.due(now=now) == {}
    assert asked == []
    assert t.due(now=5.0) == {"A": ["a"], "B": ["b"]} and 5.0 in asked


def test_track_at_the_last_now_takes_the_inline_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``track`` checks ``now`` inline and calls the full check (``_clock``) only
    for a ``now`` it refuses; requests tracked in one step share one ``now``,
    which the inline check takes (``last <= now``, not ``<``)."""
    t = HeartbeatTracker(CFG)
    checked: list[float] = []
    monkeypatch.setattr(t, "_clock", checked.append)
    for rid in ("a", "b", "c"):
        t.track(rid, engine_id="A", now=2.0)
    t.track("d", engine_id="A", now=3.0)
    assert checked == [] and len(t) == 4


def test_a_rule_that_gives_no_threshold_gives_no_shortcut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``_threshold`` gives up (-inf: ``due`` asks the rule every step) when the
    rule makes the oldest engine due at no float near ``last + interval``."""
    t = HeartbeatTracker(CFG)
    t.track("a", engine_id="A", now=0.0)
    assert t.due(now=0.0) == {"A": ["a"]}
    monkeypatch.setattr(R, "heartbeat_due", lambda last, now, interval: now - last >= 100.0)
    assert t.due(now=10.0) == {}
    assert t._threshold() == -math.inf
    assert t.due(now=100.0) == {"A": ["a"]}


@settings(max_examples=600)
@given(_ops)
def test_due_matches_a_naive_full_scan_I11(ops: list[tuple[str, object, str]]) -> None:
    cfg = LeaseConfig(kv_lease_duration=3.0)  # interval 0.5
    t = HeartbeatTracker(cfg)
    engines: dict[str, dict[str, str]] = {}
    last: dict[str, float] = {}
    now = 0.0
    for op, arg, name in ops:
        if op == "track":
            rid = f"r{arg}"
            if rid in t:
                continue
            t.track(rid, engine_id=name, now=now)
            engines.setdefault(name, {})[rid] = rid
        elif op == "untrack":
            rid = f"r{arg}"
            t.untrack(rid)
            for e in list(engines):
                engines[e].pop(rid, None)
                if not engines[e]:
                    del engines[e]
                    last.pop(e, None)
        elif op == "drop":
            assert sorted(t.drop_engine(name)) == sorted(engines.pop(name, {}))
            last.pop(name, None)
        else:
            assert isinstance(arg, float)
            now += arg
            want = {
                e: list(reqs.values())
                for e, reqs in engines.items()
                if e not in name and (e not in last or R.heartbeat_due(last[e], now, 0.5))
            }
            for e in want:
                last[e] = now
            assert t.due(now=now, pending=set(name)) == want


def test_a_str_subclass_is_a_request_id() -> None:
    # the id check takes any str (a subclass too, e.g. an engine's own id type); only
    # what is not a str at all is refused
    class ReqId(str):
        pass

    t = HeartbeatTracker(CFG)
    t.track(ReqId("d1"), engine_id="P0", remote_req_id="p1", now=0.0)
    assert t.due(now=0.0) == {"P0": ["p1"]} and t.requests("P0") == ["d1"]
    with pytest.raises(LocalProtocolError, match="must be a str"):
        t.track(7, engine_id="P0", remote_req_id="p2", now=0.0)  # type: ignore[arg-type]


def test_payloads_fill_each_message_up_to_the_byte_and_never_past_it() -> None:
    # every split of ids over messages, for ids of one to six characters and message
    # sizes around them: no message is longer than max_bytes, each one but the last
    # could not have taken the next id, and the ids come back in order
    t = HeartbeatTracker(CFG)
    for width in range(1, 7):
        ids = [f"{i:0{width}d}" for i in range(min(40, 10**width))]
        for max_bytes in range(3 + width, 3 + 5 * (width + 1)):
            out = t.payloads(ids, max_bytes=max_bytes)
            assert all(len(m) <= max_bytes for m in out), (width, max_bytes)
            got = [wire.decode(m) for m in out]
            assert [i for h in got for i in h.ids] == ids, (width, max_bytes)  # type: ignore[attr-defined]
            assert all(len(m) + 1 + width > max_bytes for m in out[:-1]), (width, max_bytes)


# Spies for two mutants of the 2026-12-06 run that only made the tracker slower
# (docs/mutation.md: a speed-only mutant gets a spy, not an equivalence note).


def test_payloads_of_due_s_own_lists_skip_the_repeat_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """``due()``'s lists name each id once, so ``payloads`` builds no set for them
    (the check's ``and`` made ``or``: a set per heartbeat); a caller's list is checked."""
    from leaseproto.core import tracker as tracker_mod

    t = HeartbeatTracker(LeaseConfig())
    for i in range(3):
        t.track(f"d{i}", engine_id="P0", remote_req_id=f"p{i}", now=10.0)
    (ids,) = t.due(now=10.0).values()
    sets: list[object] = []

    def spy(it: object = ()) -> set[object]:
        sets.append(it)
        return set(it)  # type: ignore[call-overload]

    monkeypatch.setattr(tracker_mod, "set", spy, raising=False)
    assert t.payloads(ids) == wire.encode_heartbeat(["p0", "p1", "p2"], max_bytes=4096)
    assert sets == []
    assert t.payloads(["p0", "p0", "p1"]) == wire.encode_heartbeat(["p0", "p1"], max_bytes=4096)
    assert len(sets) == 1


@pytest.mark.parametrize("now", [0.5, 5])
def test_track_takes_a_valid_now_without_the_slow_clock_check(
    monkeypatch: pytest.MonkeyPatch, now: float
) -> None:
    """A finite float at or below 1 s and an int above it are accepted by
    ``track``'s inline test, not by ``_clock`` (its ``or`` made ``and`` sent both
    there: same answer, slower)."""
    calls: list[float] = []
    real = HeartbeatTracker._clock

    def spy(self: HeartbeatTracker, t: float) -> None:
        calls.append(t)
        real(self, t)

    monkeypatch.setattr(HeartbeatTracker, "_clock", spy)
    t = HeartbeatTracker(LeaseConfig())
    t.track("d", engine_id="P0", now=now)
    assert calls == [] and t.due(now=now) == {"P0": ["d"]}


def test_a_remote_id_tracked_requests_share_is_heartbeated_until_all_go() -> None:
    """Three local requests naming one P id: heartbeats go on until the last is
    untracked (mutation run 2026-12-06: ``n > 1`` made ``n > 2`` stopped them at
    the first untrack of two, ``n - 1`` made ``n - 2`` at the second of three)."""
    t = HeartbeatTracker(LeaseConfig())
    for local in ("d1", "d2", "d3"):
        t.track(local, engine_id="P0", remote_req_id="p", now=10.0)
    for local, now in (("d1", 10.0), ("d2", 20.0)):
        t.untrack(local)
        assert t.due(now=now) == {"P0": ["p"]}, local
    t.untrack("d3")
    assert t.due(now=30.0) == {} and t.engines() == []
