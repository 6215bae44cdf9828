"""Edges of the core's small helpers that the mutation run found unpinned: the
rule helpers on plain values with any number of operands, and a heartbeat of
non-ASCII ids that fills its message exactly."""

from __future__ import annotations

import itertools

from leaseproto.core import wire
from leaseproto.core.sym import conj, disj


def test_conj_and_disj_on_plain_bools_with_any_number_of_operands() -> None:
    for n in (0, 1, 2, 3, 4):
        for conds in itertools.product([False, True], repeat=n):
            assert conj(*conds) is all(conds), conds
            assert disj(*conds) is any(conds), conds


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
