import math

import pytest

from leaseproto import HeartbeatTracker, LeaseConfig, LocalProtocolError

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


def test_stats_count_heartbeats_and_ids() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    t.track("d2", engine_id="P0", now=0.0)
    t.due(now=0.0)
    t.due(now=5.0)
    s = t.stats
    assert (s.heartbeats, s.heartbeat_ids, s.live, s.engines, s.tracked) == (2, 4, 2, 1, 2)


def test_next_due_is_minus_inf_for_a_new_engine() -> None:
    t = HeartbeatTracker(CFG)
    t.track("d1", engine_id="P0", now=0.0)
    assert t.next_due() == -math.inf
