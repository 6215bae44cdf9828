"""D's push registrations (spec §2.8, I15; ``leaseproto.core.push``): pushed KV is
used only after every writer's completion was answered OK, and a registration
that ended while a writer may still write keeps its blocks out of D's pool until
each such writer's completion or abort arrives or its agent is forgotten. Driven
together with a real LeaseTable, as the connector drives them."""

from __future__ import annotations

import pytest

from leaseproto import LeaseConfig, LeaseTable, Release, wire
from leaseproto.core import PushRegistrations
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.push import DISCARD, IGNORE, USE, WAIT

CFG = LeaseConfig(30.0)


def _completion(
    table: LeaseTable, regs: PushRegistrations, d_id: str, writer: str, *, n: int, now: float
) -> str:
    """D handles ``writer``'s completion: the table's verdict, then the registry,
    then the release it caused (the documented order)."""
    out = table.transfer_done(d_id, now=now, readers=n)
    act = regs.completion(d_id, writer, ok=isinstance(wire.verdict(d_id, out), wire.Ok))
    if isinstance(out, Release):
        regs.ended(d_id)
    return act


def test_a_completion_while_live_is_used_and_nothing_is_freed() -> None:
    table, regs = LeaseTable(CFG), PushRegistrations()
    table.grant("d1", now=0.0, ttl=60.0)
    regs.register("d1", ["p0"])
    assert _completion(table, regs, "d1", "p0", n=1, now=1.0) == USE
    assert "d1" not in regs and regs.take_free() == [] and regs.quarantined() == []


def test_every_writer_must_complete_while_live() -> None:
    table, regs = LeaseTable(CFG), PushRegistrations()
    table.grant("d1", now=0.0, ttl=60.0)
    regs.register("d1", ["p0", "p1"])
    assert _completion(table, regs, "d1", "p0", n=2, now=1.0) == WAIT
    assert regs.completion("d1", "p0", ok=True) == IGNORE  # a duplicate
    assert regs.completion("d1", "stranger", ok=True) == IGNORE
    assert _completion(table, regs, "d1", "p1", n=2, now=2.0) == USE


def test_a_completion_after_the_lapse_is_discarded_and_ends_the_quarantine() -> None:
    """The registration lapses while P (paused) still holds it: D discards the
    request at the lapse and keeps the blocks until P's late completion (NK)."""
    table, regs = LeaseTable(CFG), PushRegistrations()
    table.grant("d1", now=0.0, ttl=60.0)
    regs.register("d1", ["p0"])
    (rel,) = table.expire(now=60.0)
    assert rel.req_id == "d1" and regs.ended("d1") == DISCARD
    assert regs.take_free() == [] and regs.quarantined() == ["d1"]
    assert regs.owed("d1") == {"p0"}
    assert _completion(table, regs, "d1", "p0", n=1, now=70.0) == IGNORE  # NK, decided already
    assert regs.take_free() == ["d1"] and regs.take_free() == []
    assert "d1" not in regs and regs.owed("d1") == frozenset()


def test_an_nk_with_the_lease_live_elsewhere_discards_then_frees_after_the_release() -> None:
    regs = PushRegistrations()
    regs.register("d1", ["p0", "p1"])
    assert regs.completion("d1", "p0", ok=False) == DISCARD
    assert regs.completion("d1", "p1", ok=True) == IGNORE  # decided: never used
    assert regs.take_free() == []  # the lease has not ended: the table still holds it
    assert regs.ended("d1") == IGNORE
    assert regs.take_free() == ["d1"]


@pytest.mark.parametrize("ended_first", [True, False])
def test_an_abort_settles_its_writer_in_either_order(ended_first: bool) -> None:
    regs = PushRegistrations()
    regs.register("d1", ["p0"])
    if ended_first:  # D cancelled the registration itself, then P's abort came
        assert regs.ended("d1") == DISCARD and regs.quarantined() == ["d1"]
        assert regs.abort("d1", "p0") == IGNORE
    else:  # P's abort ended the lease (table.abort), then its release
        assert regs.abort("d1", "p0") == DISCARD
        assert regs.ended("d1") == IGNORE
    assert regs.take_free() == ["d1"]


def test_forgetting_a_writer_ends_the_quarantine_and_discards_what_waited() -> None:
    regs = PushRegistrations()
    regs.register("d1", ["p0", "p1"])
    regs.register("d2", ["p1"])
    regs.ended("d1")
    assert regs.completion("d1", "p0", ok=False) == IGNORE  # NK after the lapse
    assert regs.quarantined() == ["d1"]
    assert regs.forget("p1") == ["d2"]  # d1 was discarded at its lapse already
    assert regs.take_free() == ["d1"]
    assert regs.quarantined() == [] and "d2" in regs  # d2's lease is still D's to end
    regs.ended("d2")
    assert regs.take_free() == ["d2"] and len(regs) == 0


def test_writers_that_never_said_they_report_are_not_waited_for() -> None:
    """``ended(wait=False)``: the connector's fallback for a stock P (it never
    aborts a registration it dropped): nothing is owed, the blocks are free at
    once, and a completion after that is ignored, never used."""
    table, regs = LeaseTable(CFG), PushRegistrations()
    table.grant("d1", now=0.0, ttl=60.0)
    regs.register("d1", ["p0", "p1"])
    regs.register("d2", ["p0"])
    assert _completion(table, regs, "d1", "p0", n=2, now=1.0) == WAIT
    (rel,) = [r for r in table.expire(now=60.0) if r.req_id == "d1"]
    assert regs.ended(rel.req_id, wait=False) == DISCARD
    assert regs.quarantined() == [] and regs.owed("d1") == frozenset()
    assert regs.take_free() == ["d1"] and "d1" not in regs
    assert regs.completion("d1", "p1", ok=False) == IGNORE
    assert regs.owed("d2") == {"p0"}  # only the ended registration stopped waiting
    assert regs.ended("d2", wait=False) == DISCARD and regs.ended("d2") == IGNORE
    assert regs.take_free() == ["d2"]


def test_nothing_is_used_once_the_registration_ended() -> None:
    """A good completion handled after ``ended`` (the order reversed) costs a
    recompute, never a use."""
    regs = PushRegistrations()
    regs.register("d1", ["p0"])
    assert regs.ended("d1") == DISCARD
    assert regs.completion("d1", "p0", ok=True) == IGNORE
    assert regs.take_free() == ["d1"]


def test_the_connector_is_told_each_decision_once() -> None:
    regs = PushRegistrations()
    regs.register("d1", ["p0", "p1"])
    decisions = [
        regs.completion("d1", "p0", ok=False),
        regs.abort("d1", "p1"),
        regs.ended("d1"),
        regs.ended("d1"),
    ]
    assert decisions == [DISCARD, IGNORE, IGNORE, IGNORE]
    assert regs.take_free() == ["d1"]


def test_misuse_is_refused() -> None:
    regs = PushRegistrations()
    regs.register("d1", ["p0"])
    with pytest.raises(LocalProtocolError, match="already"):
        regs.register("d1", ["p0"])
    with pytest.raises(LocalProtocolError, match="no writer"):
        regs.register("d2", [])
    assert "d2" not in regs and len(regs) == 1
    # unknown ids are late messages: ignored, not raised
    assert regs.completion("zz", "p0", ok=True) == IGNORE
    assert regs.abort("zz", "p0") == IGNORE and regs.ended("zz") == IGNORE
    assert regs.forget("nobody") == []
