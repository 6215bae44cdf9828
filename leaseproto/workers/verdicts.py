"""The workers' verdict and ``LL`` decisions, without I/O (verified reads, I13).

What a prefill rank answers (spec §8.3-8.4) and what a decode rank does with
the answers (§7.3-7.4), as plain functions over the core's objects: the
prefill worker (:mod:`.prefill_acts`) and the decode ranks
(:mod:`.decode_reads`, :mod:`.decode_follower`) call them around their I/O, and
the model checker (:mod:`leaseproto.checker.glue`) drives the same functions in
every state it explores, so what it checks is what the workers decide. This
module imports only the core (the checker imports it, and stays light).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core import wire
from ..core.events import LateTransfer, Release, TransferCounted
from ..core.push import DISCARD, IGNORE, USE, WAIT  # what D does with a verdict (take_verdict)
from ..core.table import LeaseTable

__all__ = [
    "DISCARD",
    "IGNORE",
    "USE",
    "WAIT",
    "answer",
    "lease_lost_answers",
    "lease_lost_gives_up",
    "readers_per_p_rank",
    "take_verdict",
    "transfer_done",
]


# -- P: the answers -------------------------------------------------------------------------
def transfer_done(
    table: LeaseTable, msg: wire.TransferDone, *, now: float
) -> tuple[Release | TransferCounted | LateTransfer | None, wire.Ok | wire.Nack]:
    """P handles one transfer-done: what its table did, and the verdict owed to a
    reader that takes verdicts (:func:`~leaseproto.core.wire.verdict`: ``OK`` iff
    the lease was live when P handled it)."""
    out = table.transfer_done(msg.req_id, now=now, readers=msg.count)
    return out, wire.verdict(msg.req_id, out)


def lease_lost_answers(
    table: LeaseTable, lost: Iterable[str], *, now: float
) -> list[wire.LeaseLost]:
    """P's advisory ``LL`` for each id a heartbeat named that P no longer holds
    (``renew``'s ``lost``), with how its lease ended, if P still knows."""
    return [wire.lease_lost(r, table.lost_reason(r, now=now)) for r in lost]


def answer(msg: wire.Ok | wire.Nack | wire.LeaseLost) -> bytes:
    """The notification payload of one of P's answers."""
    if isinstance(msg, wire.Ok):
        return wire.encode_ok(msg.req_id)
    if isinstance(msg, wire.Nack):
        return wire.encode_nack(msg.req_id, msg.reason)
    return wire.encode_lease_lost(msg.req_id, msg.reason)


# -- D: the reads and what the answers decide ----------------------------------------------
def readers_per_p_rank(d_ranks: int, p_ranks: int) -> int:
    """vLLM's ``n`` in a transfer-done: how many decode ranks read from (and notify)
    each prefill rank, when D's ``d_ranks`` ranks read from P's ``p_ranks``."""
    return max(1, d_ranks // max(1, p_ranks))


def take_verdict(due: set[str], sender: str, *, ok: bool) -> str:
    """A decode rank's handling of a verdict from ``sender`` for a read that still
    waits for the verdicts of the P agents in ``due`` (updated in place):
    :data:`IGNORE` one not owed (a duplicate, or from an agent already answered),
    :data:`DISCARD` the read on ``NK``, and on ``OK``: :data:`WAIT` for the others,
    or :data:`USE` when it was the last one owed (the read may be used, I13)."""
    if sender not in due:
        return IGNORE
    if not ok:
        return DISCARD
    due.discard(sender)
    return WAIT if due else USE


def lease_lost_gives_up(*, reading: bool) -> bool:
    """Whether an advisory ``LL`` makes D give up on a request (and recompute):
    only before any of its reads started; a read under way waits for its
    verdict, which always wins."""
    return not reading
