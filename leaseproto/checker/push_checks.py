"""I15 in the push world (spec §2.8), judged against its ghosts
(:mod:`.push_world`): where each WRITE landed, which completions and aborts each
D rank handled and while the registration was live, which agents it forgot.

* **the fence**: D uses pushed KV only once every writer's WRITE landed in the
  blocks still held for it and every writer's completion was handled while the
  registration lease was live; and decides a registration's fate once;
* **the quarantine**: D returns a registration's blocks to its pool only after
  its lease ended and each writer's completion or abort was handled or its agent
  forgotten; a WRITE never lands in blocks D handed to another request;
* **its bound** (B9): a quarantine ends once no writer can act on it any more.
"""

from __future__ import annotations

from typing import Any

from ..core import wire
from ..core.push import USE
from . import glue
from .ghosts import Violation

__all__ = ["check_decision", "check_free", "check_landing", "check_quarantine_bounded"]

#: a :class:`~.push_world.PushWorld` (not imported: it imports this module)
World_ = Any


def check_landing(w: World_, r: str, d: str, p: str) -> None:
    """A WRITE never lands in blocks the grantor handed to another request."""
    if w.blocks.get((p, r)) == "reused":
        raise Violation(
            "I15",
            f"{d}'s WRITE of {r} landed in {p}'s blocks after {p} handed them to another request",
        )


def check_decision(w: World_, p: str, r: str, act: str) -> None:
    """D decides once, and uses pushed KV only when every writer wrote it into the
    held blocks and D handled each completion while the registration was live."""
    prior = w.decided.get((p, r))
    if prior is not None:
        raise Violation("I15", f"{p} decided {act} for {r}'s pushed KV after {prior}")
    if act != USE:
        return
    for d in w.D:
        if not w.reads.get((r, d, p)):
            raise Violation("I15", f"{p} used {r}'s pushed KV, which {d} had not written")
        if not w.done_live.get((p, r, d)):
            raise Violation(
                "I15",
                f"{p} used {r}'s pushed KV, though it handled {d}'s write completion "
                "after the registration lease ended",
            )


def _owed(w: World_, p: str, r: str) -> list[str]:
    """The writers that may still write into ``p``'s blocks of ``r`` (ghosts: no
    completion or abort of theirs handled, their agent not forgotten)."""
    return [d for d in w.D if (p, r, d) not in w.settled and (p, d) not in w.forgotten]


def check_free(w: World_, p: str, r: str) -> None:
    """The blocks go back to D's pool only after the lease ended and no writer is owed."""
    if w.live_inst(p, r) is not None:
        raise Violation("I15", f"{p} returned {r}'s blocks to its pool, its registration live")
    owed = _owed(w, p, r)
    if owed:
        raise Violation(
            "I15",
            f"{p} returned {r}'s blocks to its pool while {owed[0]} may still write (no "
            "completion or abort of its handled, its agent not forgotten)",
        )


def _may_act(w: World_, p: str, r: str, d: str) -> bool:
    """Whether writer ``d`` can still settle ``r`` on ``p``: it still holds the
    request (or will, once the registration reaches it), or a notification of its
    naming ``r`` is on its way to ``p``."""
    if w.phase.get(r) in ("new", "tracked"):
        return True
    mine = [m for m in (*w.net, *w.undecided, *w.inbox.get(p, ())) if m.src == d and m.dst == p]
    return any(r in glue.names(m) and not m.data.startswith(wire.HEARTBEAT_PREFIX) for m in mine)


def check_quarantine_bounded(w: World_) -> None:
    """After every step: a quarantined registration waits for a writer that can
    still act (a dead one until D forgets it); otherwise its blocks leak (B9)."""
    for p in w.P:
        for r in w.regs[p].quarantined():
            owed = _owed(w, p, r)
            if not owed:
                raise Violation(
                    "I15",
                    f"{p} keeps {r}'s blocks quarantined, though every writer settled or was "
                    "forgotten (a leak, B9)",
                )
            if w.d_alive and not any(_may_act(w, p, r, d) for d in owed):
                raise Violation(
                    "I15",
                    f"{p} keeps {r}'s blocks quarantined for {owed[0]}, which is done with it "
                    "and sent no completion or abort (a leak, B9)",
                )
