"""Edges of the core's small helpers that the mutation run found unpinned: the
rule helpers on plain values with any number of operands and beside a z3 term, and a heartbeat of
non-ASCII ids that fills its message exactly."""

from __future__ import annotations

import itertools
import math

import pytest

from leaseproto.core import wire
from leaseproto.core.sym import conj, disj, neg, vmax, vmin


def test_conj_and_disj_on_plain_bools_with_any_number_of_operands() -> None:
    for n in (0, 1, 2, 3, 4):
        for conds in itertools.product([False, True], repeat=n):
            assert conj(*conds) is all(conds), conds
            assert disj(*conds) is any(conds), conds


def test_vmax_and_vmin_give_their_first_operand_on_a_tie() -> None:
    """``0.0`` and ``-0.0`` tie: each helper returns ``a``, as its docstring says."""
    for a, b in ((0.0, -0.0), (-0.0, 0.0)):
        for helper in (vmax, vmin):
            assert math.copysign(1.0, helper(a, b)) == math.copysign(1.0, a), (helper, a, b)
    assert vmax(1.0, 2.0) == vmax(2.0, 1.0) == 2.0
    assert vmin(1.0, 2.0) == vmin(2.0, 1.0) == 1.0


def test_neg_on_plain_bools_is_a_plain_bool() -> None:
    assert neg(True) is False
    assert neg(False) is True


def test_conj_and_disj_of_a_symbolic_and_a_plain_operand_build_the_z3_term() -> None:
    """Either operand order: a plain bool beside a z3 term gives the z3 ``And``/``Or``
    (never Python's ``and``, which would ask the term for its truth value)."""
    z3 = pytest.importorskip("z3")
    x = z3.Bool("x")
    for plain in (True, False):
        for conds in ((x, plain), (plain, x)):
            for helper, want in ((conj, z3.And(x, plain)), (disj, z3.Or(x, plain))):
                term = helper(*conds)
                assert z3.is_expr(term), (helper.__name__, conds)
                s = z3.Solver()
                s.add(term != want)
                assert s.check() == z3.unsat, (helper.__name__, conds)


def test_a_heartbeat_of_non_ascii_ids_fills_its_message_exactly() -> None:
    ids = ["éaaa", "ébbb", "éccc"]  # 5 bytes each: 5 + 1 + 5 + 1 + 5 = 17 after "HB:"
    payload = wire.HEARTBEAT_PREFIX + ",".join(ids).encode()
    assert len(payload) == 20
    assert wire.encode_heartbeat(ids, max_bytes=20) == [payload]
    assert wire.encode_heartbeat(ids, max_bytes=19) == [
        wire.HEARTBEAT_PREFIX + b",".join(i.encode() for i in ids[:2]),
        wire.HEARTBEAT_PREFIX + ids[2].encode(),
    ]


def test_an_id_of_max_id_bytes_goes_on_the_wire_and_one_byte_more_does_not() -> None:
    assert wire.MAX_ID_BYTES == 512  # spec §3.3
    assert wire.id_problem("x" * 512) is None
    assert wire.id_problem("x" * 513) == "request id is 513 bytes, more than 512"
