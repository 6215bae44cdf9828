"""Leases bound to their reader (spec §10.2), on :class:`ReaderBinding` alone:
named at the grant, trust on first use otherwise, refusals counted, and
silent agents found for pruning."""

from __future__ import annotations

from leaseproto.workers.prefill_binding import ReaderBinding

LIVE = {"a", "b", "c"}


def test_named_lease_takes_every_named_agent_and_no_other() -> None:
    b = ReaderBinding()
    b.name("a", ["d0", "d1"])  # a two-rank decode engine, named by the router
    for agent in ("d0", "d1"):
        assert b.admits(agent, "a", live=True, kind="transfer_done")
    assert not b.admits("x", "a", live=True, kind="heartbeat")
    assert not b.admits("x", "a", live=True, kind="transfer_done")
    assert not b.admits("x", "a", live=True, kind="abort")
    assert b.refused == {"heartbeat": 1, "transfer_done": 1, "abort": 1}
    assert b.bound("a") == {"d0", "d1"}


def test_first_actor_binds_an_unnamed_lease_with_its_engine() -> None:
    b = ReaderBinding()
    b.name("a", ["d0", "d1"])
    assert b.admits("d1", "b", live=True, kind="heartbeat")  # b unnamed: d1's engine
    assert b.bound("b") == {"d0", "d1"}
    assert b.admits("e0", "c", live=True, kind="heartbeat")  # an agent never named
    assert b.bound("c") == {"e0"}
    assert not b.admits("d0", "c", live=True, kind="abort")
    assert b.refused["abort"] == 1


def test_ids_of_no_lease_pass_unbound() -> None:
    b = ReaderBinding()
    assert b.admits("x", "gone", live=False, kind="transfer_done")  # the core says unknown
    assert b.bound("gone") is None
    assert b.unbound_for("x", ["gone"], LIVE) == []


def test_an_ended_lease_keeps_its_binding_within_capacity() -> None:
    """A forger's late transfer-done or abort for a lease that just ended is
    refused like one for a live lease: it does not count as a late transfer
    nor earn the forger a verdict (tests/test_e2e_bound.py's forger raced a
    release and was answered as a late reader)."""
    b = ReaderBinding(ended_capacity=2)
    for rid in ("a", "b", "c"):
        b.name(rid, ["d0"])
        b.release(rid)
    assert len(b) == 0  # no live lease bound
    assert b.admits("d0", "c", live=False, kind="transfer_done")  # its reader: the core decides
    assert not b.admits("x", "c", live=False, kind="transfer_done")
    assert not b.admits("x", "b", live=False, kind="abort")
    assert b.unbound_for("x", ["c"], set()) is None  # a heartbeat takes the slow path
    assert b.admits("x", "a", live=False, kind="abort")  # forgotten: oldest first
    assert b.refused == {"heartbeat": 0, "transfer_done": 1, "abort": 1}
    b.name("c", ["e0"])  # re-granted (A7): a new lease, bound anew
    assert b.bound("c") == {"e0"} and b.admits("e0", "c", live=True, kind="abort")
    b.release("c")
    assert not b.admits("d0", "c", live=False, kind="abort")


def test_the_fast_path_check_binds_only_once_asked_like_admits() -> None:
    b = ReaderBinding()
    b.name("a", ["d0"])
    unbound = b.unbound_for("d0", ["a", "b", "unknown"], LIVE)
    assert unbound == ["b"] and b.bound("b") is None  # nothing bound before the renewal
    b.bind("d0", unbound)
    assert b.bound("b") == {"d0"} and b.bound("unknown") is None
    assert b.unbound_for("x", ["c", "a"], LIVE) is None  # a is d0's: the slow path
    assert b.bound("c") is None
    assert b.refused["heartbeat"] == 0  # the slow path counts, id by id


def test_silent_agents_are_those_unheard_and_bound_to_no_live_lease() -> None:
    b = ReaderBinding()
    b.name("a", ["d0", "d1"])
    for agent in ("d0", "d1", "e0"):
        b.heard(agent, 0.0)
    b.heard("e1", 9.0)
    assert b.silent(now=10.0, ttl=5.0) == ["e0"]  # d0, d1 hold lease a; e1 spoke
    b.release("a")
    assert sorted(b.silent(now=10.0, ttl=5.0)) == ["d0", "d1"]
    assert b.last_heard == {"e1": 9.0}
    # a forgotten agent binds a new lease to itself alone (its naming is gone)
    assert b.admits("d0", "c", live=True, kind="heartbeat")
    assert b.bound("c") == {"d0"}


def test_agents_kept_in_use_are_not_silent() -> None:
    b = ReaderBinding()
    for agent in ("d0", "e0"):
        b.heard(agent, 0.0)
    assert b.silent(now=10.0, ttl=5.0, keep={"d0"}) == ["e0"]  # P reads d0's turn
    assert b.last_heard == {"d0": 0.0}  # kept as it was: forgotten once unused
    assert b.silent(now=10.0, ttl=5.0) == ["d0"]


def test_only_engine_is_the_one_set_bound_to() -> None:
    b = ReaderBinding()
    assert b.only_engine() is None
    b.name("a", ["d0", "d1"])
    b.name("b", ["d1", "d0"])  # the same engine, named again: one shared set
    assert b.only_engine() == {"d0", "d1"} and b.bound("a") is b.bound("b")
    assert b.admits("e0", "c", live=True, kind="heartbeat")  # a second engine
    assert b.only_engine() is None
    b.release("c")
    assert b.only_engine() == {"d0", "d1"}
    b.release("a")
    b.release("b")
    assert b.only_engine() is None and len(b) == 0
