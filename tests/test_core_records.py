"""The core's small records: statistics start at zero (a table or tracker that has
done nothing reports nothing), a Release takes its times by keyword, a clock
sample is kept only when it is tighter."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import asdict

import pytest

from leaseproto import HeartbeatTracker, LeaseConfig, LeaseTable
from leaseproto.core import events
from leaseproto.core.clock import ClockOffset
from leaseproto.core.events import Release, ReleaseReason
from leaseproto.core.lease import TableStats
from leaseproto.core.tracker import TrackerStats


def test_stats_records_default_to_zero() -> None:
    for record in (TableStats(), TrackerStats()):
        values = asdict(record)
        assert values and all(v == 0 for v in values.values()), values


def test_stats_records_are_frozen_and_slotted() -> None:
    # a snapshot: the caller cannot change a table's or tracker's counters through it
    for record in (TableStats(), TrackerStats()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.live = 1  # type: ignore[misc]
        assert not hasattr(record, "__dict__"), type(record).__name__


def test_a_clock_and_the_tracker_s_engine_records_are_slotted() -> None:
    """One per peer (ClockOffset) and one per P engine (the tracker's map of an
    engine's requests): no per-instance ``__dict__``."""
    assert not hasattr(ClockOffset(), "__dict__")
    t = HeartbeatTracker(LeaseConfig())
    t.track("d1", engine_id="P0", now=0.0)
    (reqs,) = t._by_engine.values()
    # remote id -> how many tracked requests name it
    assert not hasattr(reqs, "__dict__") and reqs.engine == "P0" and reqs == {"d1": 1}


def test_an_expire_call_s_releases_are_slotted() -> None:
    """One per ``expire`` call that releases anything: no per-instance ``__dict__``,
    and a mistyped attribute raises."""
    t = LeaseTable(LeaseConfig())
    t.grant("a", now=0.0)
    out = t.expire(now=1000.0)
    assert type(out) is events.Releases and out.ids == ["a"]
    assert not hasattr(out, "__dict__")
    with pytest.raises(AttributeError):
        out.idz = []  # type: ignore[attr-defined]


def test_a_fresh_table_and_tracker_report_zero() -> None:
    assert asdict(LeaseTable(LeaseConfig()).stats) == asdict(TableStats())
    assert asdict(HeartbeatTracker(LeaseConfig()).stats) == asdict(TrackerStats())


def test_release_takes_its_times_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        Release("r", ReleaseReason.EXPIRED, 1.0, 0.0)  # type: ignore[misc]
    r = Release("r", ReleaseReason.EXPIRED, 1.0, granted_at=0.0, deadline=1.0)
    assert (r.granted_at, r.deadline, r.last_renewal) == (0.0, 1.0, None)


def test_the_other_events_take_their_counts_and_times_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        events.LateTransfer("r", ReleaseReason.EXPIRED, 2.0, 1.0)  # type: ignore[misc]
    late = events.LateTransfer("r", ReleaseReason.EXPIRED, 2.0, ended_at=1.0)
    assert (late.at, late.ended_at) == (2.0, 1.0)
    assert events.LateTransfer("r", ReleaseReason.ABORTED, 2.0).ended_at == 0.0
    with pytest.raises(TypeError):  # done, positionally
        events.TransferCounted("r", 2.0, 1, readers=2)  # type: ignore[misc]
    with pytest.raises(TypeError):  # readers, positionally
        events.TransferCounted("r", 2.0, 2, done=1)  # type: ignore[misc]
    counted = events.TransferCounted("r", 2.0, done=1, readers=2)
    assert (counted.done, counted.readers) == (1, 2)


def test_a_clock_sample_is_kept_only_when_its_round_trip_is_shorter() -> None:
    c = ClockOffset(rho=0.0)
    assert c.add_sample(t0=0.0, remote_time=10.0, t1=2.0)
    assert not c.add_sample(t0=0.0, remote_time=10.0, t1=3.0)  # rtt 3 > 2: worse
    assert c.uncertainty == 1.0
    assert c.add_sample(t0=0.0, remote_time=10.0, t1=1.0)  # rtt 1 < 2: better
    assert c.uncertainty == 0.5 and c.offset == 9.5


def test_every_event_is_frozen_and_slotted() -> None:
    for name in events.__all__:
        cls = getattr(events, name)
        if not dataclasses.is_dataclass(cls):
            continue
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert params.frozen, f"{name} is not frozen"
        assert "__slots__" in vars(cls) and "__dict__" not in dir(cls), f"{name} has no slots"


def test_every_wire_message_is_frozen_hashable_and_slotted() -> None:
    """A worker makes one per notification: no per-instance ``__dict__``."""
    from leaseproto.core import wire

    messages = [
        wire.Heartbeat(("a", "b")),
        wire.TransferDone("a", 2),
        wire.Abort("a"),
        wire.Ok("a"),
        wire.Nack("a", "expired"),
        wire.LeaseLost("a", "unknown"),
    ]
    assert {type(m) for m in messages} == set(typing.get_args(wire.Message))
    for message in messages:
        field = dataclasses.fields(message)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(message, field, getattr(message, field))
        assert hash(message) == hash(dataclasses.replace(message))
        assert not hasattr(message, "__dict__"), type(message).__name__


def test_an_expire_call_s_releases_let_go_of_the_lease_records_once_built() -> None:
    """``Releases`` builds each ``Release`` when first read and then holds no lease
    record (mutation run 2026-12-06: ``self._leases = ()`` deleted kept every
    expired lease's record alive as long as the releases)."""
    t = LeaseTable(LeaseConfig())
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    out = t.expire(now=1000.0)
    assert [r.req_id for r in out] == ["a", "b"]
    assert out._leases == ()
    assert [r.req_id for r in out] == ["a", "b"]  # built once, read again


def test_the_tracker_s_id_lists_are_plain_lists() -> None:
    """``due()``'s lists are exact ``list`` objects: ``str.join`` copies any other
    sequence (a list subclass included) before joining, which made the 10-id payload
    1.6x slower (2026-12-07); and ``payloads`` knows them by identity, so it builds no
    set for them, also after a later ``due()`` handed out other lists."""
    t = HeartbeatTracker(LeaseConfig())
    t.track("d", engine_id="P0", now=10.0)
    (ids,) = t.due(now=10.0).values()
    assert type(ids) is list
    assert id(ids) in t._handed
    (later,) = t.due(now=20.0).values()
    assert id(later) in t._handed and id(ids) not in t._handed  # only the last call's
    assert t.payloads(ids) == t.payloads(later) == [b"HB:d"]


def test_lease_info_reports_the_cap_instant() -> None:
    """``cap_at`` is ``granted_at + max_lease_lifetime`` (mutation run 2026-12-06:
    ``+`` made ``-``), ``None`` without a cap."""
    t = LeaseTable(LeaseConfig(kv_lease_duration=5.0, max_lease_lifetime=7.0))
    t.grant("a", now=10.0)
    info = t.lease_info("a")
    assert info is not None and info["cap_at"] == 17.0 and info["granted_at"] == 10.0
    u = LeaseTable(LeaseConfig())
    u.grant("a", now=10.0)
    assert (u.lease_info("a") or {})["cap_at"] is None


def test_an_expired_lease_s_tombstone_is_forgotten_at_its_ttl() -> None:
    """The tombstones one ``expire`` call leaves are pruned ``tombstone_ttl``
    later, with nothing else in the table to prune (mutation run 2026-12-06: the
    bulk expiry's ``_kept`` deleted left them until some other entry's time)."""
    cfg = LeaseConfig(kv_lease_duration=5.0)
    ttl = cfg.tombstone_ttl
    t = LeaseTable(cfg)
    t.grant("a", now=0.0)
    assert t.expire(now=5.0).ids == ["a"]
    assert t.ended("a") is ReleaseReason.EXPIRED
    t.expire(now=5.0 + ttl - 0.5)
    assert t.ended("a") is ReleaseReason.EXPIRED
    t.expire(now=5.0 + ttl)
    assert t.ended("a") is None


def test_an_expire_call_s_releases_compare_and_print_as_a_list() -> None:
    """``Releases`` equals another ``Releases`` or a list of the same releases,
    leaves any other comparison to the other operand, and prints its releases
    (mutation run 2026-12-06: ``__eq__`` and ``__repr__`` reached by no test)."""
    t, u = LeaseTable(LeaseConfig()), LeaseTable(LeaseConfig())
    for table in (t, u):
        table.grant("a", now=0.0)
    out, same = t.expire(now=1000.0), u.expire(now=1000.0)
    assert out == same
    assert (out != same) is False
    assert out == list(same) and list(out) == same
    assert out.__eq__(5) is NotImplemented and (out == 5) is False
    t.grant("b", now=1000.0)
    assert t.expire(now=2000.0) != out
    assert repr(out) == f"Releases({list(out)!r})" and "req_id='a'" in repr(out)
