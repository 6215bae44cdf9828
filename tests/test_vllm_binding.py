"""P's bindings of leases to their readers and its record of greeting decoders
(integrations/vllm/binding.py). No vLLM needed."""

from __future__ import annotations

from leaseproto.integrations.vllm.binding import Greeters, ReaderBindings


def test_first_act_binds_and_a_stranger_is_ignored() -> None:
    b = ReaderBindings(join_window=5.0)
    assert b.admit("r", "d0", now=0.0, act="heartbeat")
    assert b.admit("r", "d0", now=1.0, act="transfer", readers=1)
    assert not b.admit("r", "x", now=1.0, act="heartbeat")  # capacity 1 reached
    assert not b.admit("r", "x", now=1.0, act="transfer")
    assert not b.admit("r", "x", now=1.0, act="abort")
    assert b.agents("r") == {"d0"} and b.ignored == 3


def test_siblings_join_within_the_window_up_to_the_readers() -> None:
    """D TP > P TP: two D ranks read one P rank (n = 2)."""
    b = ReaderBindings(join_window=5.0)
    assert b.admit("r", "d0", now=0.0, act="heartbeat")
    assert b.admit("r", "d1", now=0.5, act="heartbeat")
    assert b.admit("r", "d0", now=2.0, act="transfer", readers=2)
    assert not b.admit("r", "x", now=2.0, act="transfer", readers=2)  # 2 of 2 bound
    assert b.admit("r", "d1", now=2.1, act="transfer", readers=2)
    assert b.agents("r") == {"d0", "d1"}


def test_a_stranger_transfer_done_cannot_join_before_a_bound_one() -> None:
    b = ReaderBindings(join_window=5.0)
    assert b.admit("r", "d0", now=0.0, act="heartbeat")
    assert not b.admit("r", "x", now=0.1, act="transfer", readers=2)
    assert b.admit("r", "d0", now=0.2, act="transfer", readers=2)
    assert b.admit("r", "d1", now=0.3, act="transfer", readers=2)  # now it may


def test_the_window_closes() -> None:
    b = ReaderBindings(join_window=5.0)
    assert b.admit("r", "d0", now=0.0, act="heartbeat")
    assert not b.admit("r", "x", now=5.0, act="heartbeat")
    assert b.admit("r", "d0", now=50.0, act="heartbeat")


def test_an_abort_never_binds() -> None:
    b = ReaderBindings(join_window=5.0)
    assert not b.admit("r", "x", now=0.0, act="abort")
    assert len(b) == 0
    assert b.admit("r", "d0", now=0.0, act="heartbeat")
    assert b.admit("r", "d0", now=0.1, act="abort")


def test_prune_keeps_the_index_in_step() -> None:
    b = ReaderBindings(join_window=5.0)
    for i in range(100):
        b.admit(f"r{i}", "d0", now=0.0, act="heartbeat")
    assert len(b.leases_of("d0")) == 100
    assert b.prune(lambda rid: rid == "r7") == 99
    assert len(b) == 1 and b.leases_of("d0") == {"r7"}
    b.prune(lambda rid: False)
    assert b.leases_of("d0") == set() and b._by_agent == {}


def test_greeters_forget_the_silent_not_the_busy() -> None:
    g = Greeters(ttl=100.0)
    g.add("a", "a", now=0.0)
    g.add("b", "b", now=0.0)
    g.add("c", "c", now=0.0)
    g.heard("c", now=50.0)
    g.heard("stranger", now=50.0)  # not loaded: not tracked
    assert "stranger" not in g
    assert g.silent(now=99.0, busy=lambda a: False) == []
    silent = g.silent(now=100.0, busy=lambda a: a == "b")
    assert silent == [("a", "a")]
    g.forget(a for a, _ in silent)
    assert "a" not in g and len(g) == 2
    assert g.silent(now=100.5, busy=lambda a: False) == []  # once a second at most
    assert sorted(g.silent(now=150.0, busy=lambda a: False)) == [("b", "b"), ("c", "c")]
