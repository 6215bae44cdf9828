"""The transition table (leaseproto.core.state) is total where it must be and
the rules (leaseproto.core.rules) follow it (style: h2's totality test)."""

import dataclasses
from itertools import product

import pytest

from leaseproto import TRANSITIONS, Guard, Input, LeaseState
from leaseproto.core import rules as R
from leaseproto.core.state import ENDED_STATES, Transition


def test_table_is_total_except_granting_a_granted_or_ended_lease() -> None:
    missing = {(s, i) for s, i in product(LeaseState, Input) if (s, i) not in TRANSITIONS}
    assert missing == {(s, Input.GRANT) for s in LeaseState if s is not LeaseState.ABSENT}


def test_a_row_of_the_table_is_a_frozen_slotted_record() -> None:
    # the rows are shared by the runtime, the proofs, the checker and the diagram:
    # none of them can change one in place
    row = TRANSITIONS[(LeaseState.GRANTED, Input.RECV_ABORT)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.target = LeaseState.EXPIRED  # type: ignore[misc]
    assert not hasattr(row, "__dict__")
    assert row == Transition(LeaseState.ABORTED, Guard.ALWAYS, "release")
    assert hash(row) == hash(Transition(LeaseState.ABORTED, Guard.ALWAYS, "release"))


def test_ended_states_are_absorbing_I2() -> None:
    for (src, _inp), t in TRANSITIONS.items():
        if src in ENDED_STATES:
            assert t.target is src


def test_only_granted_leases_are_released_I3() -> None:
    releases = {(s, i) for (s, i), t in TRANSITIONS.items() if t.effect == "release"}
    assert releases == {
        (LeaseState.GRANTED, Input.RECV_TRANSFER_DONE),
        (LeaseState.GRANTED, Input.RECV_ABORT),
        (LeaseState.GRANTED, Input.TIMER_EXPIRE),
    }
    for s, i in releases:
        assert TRANSITIONS[(s, i)].target in ENDED_STATES


def test_nothing_but_grant_enters_granted_I2() -> None:
    into = {
        (s, i)
        for (s, i), t in TRANSITIONS.items()
        if t.target is LeaseState.GRANTED and s is not LeaseState.GRANTED
    }
    assert into == {(LeaseState.ABSENT, Input.GRANT)}


@pytest.mark.parametrize(("state", "inp"), sorted(TRANSITIONS, key=lambda k: (k[0], k[1].value)))
def test_next_state_follows_the_table(state: LeaseState, inp: Input) -> None:
    t = TRANSITIONS[(state, inp)]
    assert R.next_state(int(state), inp, True) == int(t.target)
    expect_false = int(t.target) if t.guard is Guard.ALWAYS else int(state)
    assert R.next_state(int(state), inp, False) == expect_false


def test_next_state_raises_for_pairs_outside_the_table() -> None:
    with pytest.raises(KeyError):
        R.next_state(int(LeaseState.GRANTED), Input.GRANT, True)


def test_rules_on_floats() -> None:
    g = R.GRANTED
    assert R.renew_deadline(g, 30.0, None, 15.0, 20.0) == 35.0
    assert R.renew_deadline(g, 30.0, None, 30.0, 20.0) == 30.0  # lapsed: no revival
    assert R.renew_deadline(R.EXPIRED, 30.0, None, 10.0, 20.0) == 30.0
    assert R.renew_deadline(g, 30.0, 32.0, 15.0, 20.0) == 32.0
    assert R.expire_state(g, 30.0, 30.0) == R.EXPIRED
    assert R.expire_state(g, 30.0, 29.0) == g
    assert R.transfer_done_state(g, 1, 2) == R.TRANSFERRED
    assert R.transfer_done_state(g, 0, 2) == g
    assert R.transfer_done_count(R.ABORTED, 1) == 1
    assert R.transfer_done_count(g, 1) == 2
    assert R.renew_applies(g, 30.0, 15.0) is True
    assert R.renew_applies(g, 30.0, 30.0) is False  # lapsed
    assert R.renew_applies(R.EXPIRED, 30.0, 10.0) is False
    assert R.abort_state(R.TRANSFERRED) == R.TRANSFERRED
    assert R.heartbeat_due(0.0, 5.0, 5.0) and not R.heartbeat_due(0.0, 4.9, 5.0)
    assert R.heartbeat_due(1.0, 5.0, 4.0) and not R.heartbeat_due(1.0, 4.5, 4.0)
    # I9: strictly before the peer's deadline, margin and uncertainty included
    assert R.read_allowed(10.0, 7.0, 0.5, 0.25, 2.0)  # 9.25 < 9.5
    assert not R.read_allowed(10.0, 7.0, 0.5, 0.25, 2.25)  # 9.5 is not < 9.5
