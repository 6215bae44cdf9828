"""The workers' glue around the core, as the checked world runs it.

The decisions are the workers' own (:mod:`leaseproto.workers.verdicts`, which
the prefill and decode workers call around their I/O): P's side (spec
§8.2-8.4): each heartbeat renews, each lost id is answered ``LL``
(``lease_lost_answers``); each transfer-done is answered with its verdict
(``transfer_done``); each abort ends the lease or is staged. D's side
(§7.3-7.4): each D rank's read waits for the verdict of every P rank
(``take_verdict``), the request is used once every rank's are ``OK``; ``NK``
discards it, ``LL`` gives up on a request none of whose reads started
(``lease_lost_gives_up``). Here is only what the world adds: the ghosts and
the checks of :mod:`.invariants` between the decisions.

The clock handshake and the read gate (§8.7, I9) run in scopes with ``gate``:
D sends P a hello, P answers with its clock reading (P's clock is D's plus
``scope.skew`` ticks), D records the sample in a real
:class:`~leaseproto.core.clock.ClockOffset` and reads P's blocks only when
:meth:`~leaseproto.core.clock.ClockOffset.read_allowed` admits it for the
lease's deadline on P's clock. That is §8.7's gate with the roles of its
bidirectional use swapped (the reader holds a deadline stamped on the peer's
clock); the tables run on the shared grid, and P's clock is their time plus
the skew, which changes nothing in them since the core only compares times.
"""

from __future__ import annotations

from typing import Any

from ..core import wire
from ..core.clock import ClockOffset
from ..core.events import Release
from ..workers import verdicts
from . import invariants as inv
from .ghosts import Msg, Violation

__all__ = ["CLOCK", "HELLO", "at_d", "at_p", "check_gated_read", "gate_admits", "names"]

#: the handshake's messages (not protocol bytes: the workers' hello exchange)
HELLO = b"\x00hello"
CLOCK = b"\x00clock:"

#: a :class:`~.world.World` (not imported: the world imports this module)
World_ = Any


def names(m: Msg) -> tuple[str, ...]:
    """The request ids a notification names (none for the clock handshake's)."""
    if m.data == HELLO or m.data.startswith(CLOCK):
        return ()
    msg: Any = wire.decode(m.data)
    return tuple(msg.ids) if isinstance(msg, wire.Heartbeat) else (msg.req_id,)


def at_p(w: World_, p: str, m: Msg) -> None:
    """P's handling of one arrived notification."""
    if m.data == HELLO:
        w.send(p, m.src, CLOCK + str(w.now + w.scope.skew).encode())
        return
    msg = wire.decode(m.data)
    src = m.src
    table = w.tables[p]
    now = float(w.now)
    if isinstance(msg, wire.Heartbeat):
        before = {r: table.deadline(r) for r in msg.ids}
        lost: list[str] = []
        table.renew(msg.ids, now=now, lost=lost)
        inv.check_renewal(w, p, before, lost)
        for r in msg.ids:  # ghost: P's last heartbeat naming a live lease (I6's h)
            inst = w.live_inst(p, r)
            if inst is not None:
                inst.renewed_at = w.now
        for ll in verdicts.lease_lost_answers(table, lost, now=now):
            w.send(p, w.D[0], verdicts.answer(ll))
    elif isinstance(msg, wire.TransferDone):
        r = msg.req_id
        inst = w.live_inst(p, r)
        tomb = inv.tombstone_owed(w, p, r)
        res, verdict = verdicts.transfer_done(table, msg, now=now)
        w.on_completion(p, src, r, ok=isinstance(verdict, wire.Ok), live=inst is not None)
        if inst is not None:
            inst.tds += 1
            if inst.tds >= msg.count and r in table:
                raise Violation(
                    "I10", f"{r} on {p}: {inst.tds} transfer-dones of n = {msg.count} left it live"
                )
        elif res is None:
            w.staged[(p, r)] = w.staged.get((p, r), 0) + 1
            w.staged_mark.setdefault((p, r), table.stats.early_dropped)
        if isinstance(res, Release):
            w.released(p, r, res)
        inv.check_verdict(w, p, r, live=inst is not None, tomb=tomb, v=verdict)
        w.send(p, src, verdicts.answer(verdict))
    elif isinstance(msg, wire.Abort):
        r = msg.req_id
        inst = w.live_inst(p, r)
        known = table.ended(r) is not None
        dropped = table.stats.early_dropped
        res = table.abort(r, now=now)
        w.on_abort(p, src, r)
        if isinstance(res, Release):
            w.released(p, r, res)
        elif inst is None and not known and table.stats.early_dropped == dropped:
            w.staged_abort.add((p, r))
            w.staged_mark.setdefault((p, r), dropped)
    else:
        raise Violation("wire", f"P received {msg!r}, which only P sends")


def at_d(w: World_, d: str, m: Msg) -> None:
    """D's handling of one arrived verdict, lease-lost or clock reply."""
    p = m.src
    if m.data.startswith(CLOCK):
        if w.d_alive and d == w.D[0]:
            clock = w.clocks.setdefault(p, ClockOffset(rho=w.scope.rho))
            remote = float(m.data[len(CLOCK) :])
            clock.add_sample(t0=w.d_clock(w.hello[p]), remote_time=remote, t1=w.d_clock(w.now))
        return
    msg: Any = wire.decode(m.data)
    r = msg.req_id
    if not w.d_alive or w.phase.get(r) != "tracked":
        return  # late: D is done with it
    if isinstance(msg, (wire.Ok, wire.Nack)):
        act = verdicts.take_verdict(w.due[(r, d)], p, ok=isinstance(msg, wire.Ok))
        if act == verdicts.DISCARD:
            w.untrack(r, "failed")  # discard the read, recompute
        elif act == verdicts.USE and not any(w.due[(r, e)] for e in w.D):
            w.reader_used(r)  # every rank's reads confirmed (followers hand over)
            w.untrack(r, "done")
    elif isinstance(msg, wire.LeaseLost):
        # advisory: never overrides a verdict; D fails over only before reading
        if verdicts.lease_lost_gives_up(reading=any(k[0] == r for k in w.reads)):
            w.give_up(r)
    else:
        raise Violation("wire", f"D received {msg!r}, which only D sends")


def gate_admits(w: World_, r: str, p: str) -> bool:
    """Whether D's gate admits reading ``r`` from ``p`` now (scopes with ``gate``)."""
    deadline = w.tables[p].deadline(r)
    clock = w.clocks.get(p)
    if deadline is None or clock is None:
        return False  # ended (D would use the deadline P last advertised), or no sample
    margin = float(w.scope.gate_margin)
    remote = deadline + w.scope.skew  # on P's clock
    return bool(clock.read_allowed(remote, now=w.d_clock(w.now), margin=margin))


def check_gated_read(w: World_, r: str, p: str) -> None:
    """I9: a read the gate admitted starts ``margin`` before the lease's deadline."""
    deadline = w.tables[p].deadline(r)
    if deadline is None or not w.now + w.scope.gate_margin < deadline:
        clock = w.clocks[p]
        raise Violation(
            "I9",
            f"the gate admitted reading {r} from {p} at {w.now} with margin "
            f"{w.scope.gate_margin}, deadline {deadline} (estimated offset {clock.offset}, "
            f"uncertainty {clock.uncertainty_at(w.d_clock(w.now))} at D's {w.d_clock(w.now)}, "
            f"true offset {w.now + w.scope.skew - w.d_clock(w.now)})",
        )
