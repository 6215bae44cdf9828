"""The runtime's concrete branch of every rule and the branch the proofs evaluate
(z3 terms) agree on every input: the proofs prove what the runtime executes.

``next_state`` has two code paths (a table lookup on ``int``, an ``ite`` chain on
z3 terms); the other rules are written with :mod:`leaseproto.core.sym`, whose
helpers also branch on the kind of value. Each is evaluated both ways on every
(state, input, guard) and on a grid of numbers with ties (``now == deadline``).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import z3

from leaseproto.core import rules as R
from leaseproto.core.state import TRANSITIONS, Input, LeaseState

STATES = [int(s) for s in LeaseState]
TIMES = [0.0, 1.0, 2.5, 3.0]


def sym(v: Any) -> Any:
    """The z3 literal for a Python value (so the rule takes its symbolic path);
    ``None`` (no cap) is structural and stays."""
    if v is None:
        return None
    if isinstance(v, bool):
        return z3.BoolVal(v)
    if isinstance(v, int):
        return z3.IntVal(v)
    return z3.RealVal(v)


def value(term: Any) -> Any:
    """A closed z3 term's Python value."""
    t = z3.simplify(term)
    if z3.is_true(t):
        return True
    if z3.is_false(t):
        return False
    if z3.is_int_value(t):
        return t.as_long()
    if z3.is_rational_value(t):
        return t.numerator_as_long() / t.denominator_as_long()
    raise AssertionError(f"not a closed value: {term}")


def agree(rule: Any, *args: Any) -> None:
    concrete = rule(*args)
    symbolic = rule(*(sym(a) for a in args))
    if isinstance(concrete, tuple):
        assert tuple(value(x) for x in symbolic) == concrete, (rule.__name__, args)
    else:
        assert value(symbolic) == concrete, (rule.__name__, args)


@pytest.mark.parametrize("inp", list(Input), ids=lambda i: i.name)
def test_next_state_lookup_and_ite_chain_agree_on_every_state_and_guard(inp: Input) -> None:
    for state, guard in itertools.product(STATES, (True, False)):
        symbolic = value(R.next_state(z3.IntVal(state), inp, z3.BoolVal(guard)))
        if (LeaseState(state), inp) not in TRANSITIONS:
            with pytest.raises(KeyError):
                R.next_state(state, inp, guard)
            assert symbolic == R.NO_ROW
        else:
            assert R.next_state(state, inp, guard) == symbolic, (state, inp, guard)


def test_state_rules_agree() -> None:
    for state in STATES:
        for done, consumers in itertools.product(range(3), range(1, 4)):
            if (LeaseState(state), Input.RECV_TRANSFER_DONE) in TRANSITIONS:
                agree(R.transfer_done_state, state, done, consumers)
            agree(R.transfer_done_count, state, done)
            agree(R.transfer_is_last, done, consumers)
        agree(R.abort_state, state)
        agree(R.transfer_verdict_ok, state)
        for deadline, now in itertools.product(TIMES, TIMES):
            agree(R.expire_due, state, deadline, now)
            agree(R.expire_state, state, deadline, now)
            agree(R.renew_applies, state, deadline, now)
            for ext in (0.5, 2.0):
                agree(R.renew_deadline, state, deadline, None, now, ext)
                for cap in TIMES:
                    agree(R.renew_rule, state, deadline, cap, now, ext)
                    agree(R.renew_deadline, state, deadline, cap, now, ext)


def test_timing_rules_agree() -> None:
    for a, b, c in itertools.product(TIMES, TIMES, (0.5, 1.0, 2.0)):
        agree(R.grant_deadline, a, c)
        agree(R.heartbeat_due, a, b, c)
        for unc, margin in itertools.product((0.0, 0.5), (0.0, 1.0)):
            agree(R.read_allowed, a, b, c - 1.0, unc, margin)
