"""The router giving up on a request, as the checked world runs it (scope
``giveup``, I17).

The router fails a request when a P rank refuses or fails it, when a worker's
connection drops, when D is unreachable or answers that it failed, or when the
request outlives its deadline (``workers/router.py``); whom it then tells to
abort is the workers' own rule, :func:`leaseproto.workers.giveup.give_up`, run
here unchanged. What the world adds is when each cause can happen and the
control plane: the router's ``abort`` reaches a P rank or D at its next turn
(ZeroMQ: reliable and ordered, so never lost). A P rank handles it as the
prefill worker does (the queued prefill is dropped, so the rank never grants
the request, and ``LeaseTable.abort`` ends a lease it granted); D handles it as
the decode worker does (stops tracking the request and sends every P rank
``AB:``, §8.4).

**I17**: a request the router gave up on leaves nothing held: at each P rank's
step after the give-up, the rank holds no lease for it, unless the rank was the
one lost (the router cannot reach it) or D was lost (D may still be reading;
the leases lapse, I5/I6); and at D's first turn after it, D no longer tracks
it, unless D is gone.
"""

from __future__ import annotations

from typing import Any

from ..core.events import Release
from ..workers import giveup
from .ghosts import Action, Violation

__all__ = ["actions", "at_d", "at_p", "check_d", "check_p", "do_give_up", "refuse"]

#: a :class:`~.world.World` (not imported: the world imports this module)
World_ = Any

#: the control plane's queue of router aborts for D
D_CTL = "router->D"


def actions(w: World_) -> list[Action]:
    """The router's give-ups possible now, each ``("give_up", r, cause, rank)``."""
    out: list[Action] = []
    for r in w.R:
        if r in w.gave_up:
            continue
        ph = w.phase[r]
        if ph == "new":
            out.append(("give_up", r, "timeout", None))
            if r not in w.first_grant:  # at intake: a rank refused the prefill
                out.append(("give_up", r, "unsent", None))
            for k, p in enumerate(w.P):
                if not w.inst.get((p, r)) and (p, r) not in w.cancelled:
                    out.append(("give_up", r, "rank_failed", k))  # it answered an error
                out.append(("give_up", r, "lost", k))  # its connection dropped
            if all(w.inst.get((p, r)) for p in w.P):  # every rank answered: D unreachable
                out.append(("give_up", r, "decode_unreachable", None))
        elif ph == "tracked":
            out.append(("give_up", r, "timeout", None))
        elif r in w.routed and ph in ("failed", "aborted"):
            out.append(("give_up", r, "decode_failed", None))  # D answered ok = false
        elif r in w.routed and ph == "crashed":
            out.append(("give_up", r, "lost", None))  # D's connection dropped
    return out


def refuse(w: World_, r: str) -> None:
    """D refuses ``r`` at intake (``DecodeScheduler.intake``: parameters it cannot
    serve): it never tracks it, tells P nothing and answers the router ``ok`` =
    false, the one way D fails a request without its own ``AB:`` reaching P."""
    w.phase[r] = "failed"
    w.routed.add(r)


def do_give_up(w: World_, r: str, cause: str, rank: int | None) -> None:
    """The router fails ``r`` and sends the aborts the workers' rule names."""
    stage = "decode" if r in w.routed else "prefill"
    out = giveup.give_up(cause, stage=stage, p_ranks=len(w.P), rank=rank)
    if cause == "lost":  # the ranks the router cannot reach, or all while D may read
        exempt = frozenset(w.P) if rank is None else frozenset({w.P[rank]})
    else:
        exempt = frozenset()
    w.gave_up[r] = (w.now, exempt)
    if cause == "rank_failed" and rank is not None:
        w.cancelled.add((w.P[rank], r))  # the rank failed the prefill: it never grants
    for i in out.prefill:
        w.ctl.setdefault(w.P[i], []).append(r)
    if out.decode:
        w.ctl.setdefault(D_CTL, []).append(r)


def at_p(w: World_, p: str) -> None:
    """P rank ``p`` handles the router's aborts (``PrefillWorker._abort``)."""
    table = w.tables[p]
    for r in w.ctl.pop(p, ()):
        w.cancelled.add((p, r))  # the queued prefill is dropped
        res = table.abort(r, now=float(w.now))
        if isinstance(res, Release):
            w.released(p, r, res)


def at_d(w: World_) -> None:
    """D handles the router's aborts (``DecodeScheduler.abort``)."""
    for r in w.ctl.pop(D_CTL, ()):
        if w.d_alive and w.phase[r] == "tracked":
            w.abort_request(r)


def check_p(w: World_, p: str) -> None:
    """I17 on P: after its step, ``p`` holds no lease of a request given up before now."""
    table = w.tables[p]
    for r, (at, exempt) in w.gave_up.items():
        if at < w.now and p not in exempt and r in table:
            raise Violation(
                "I17", f"the router gave up on {r} at {at}; {p} still holds its lease at {w.now}"
            )


def check_d(w: World_) -> None:
    """I17 on D: after its first turn past a give-up, D no longer tracks the request."""
    for r, (at, _) in w.gave_up.items():
        if at < w.now and w.d_alive and w.phase[r] == "tracked":
            raise Violation(
                "I17", f"the router gave up on {r} at {at}; D still tracks it at {w.now}"
            )
