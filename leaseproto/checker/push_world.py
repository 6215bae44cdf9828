"""The push-mode world (spec §2.8, I15, I16): D grants, P heartbeats and WRITEs.

The same world as the turn-2 read (``mirror``: the grantor ranks are D's real
:class:`~leaseproto.LeaseTable` s, now holding push registrations for
``push_registration_timeout``; the reader's ranks are P's, heartbeating D's lease
id from a real :class:`~leaseproto.HeartbeatTracker` on P's own drifting clock),
with what push mode changes:

* P's transfer is a WRITE into D's registered blocks: the ghost records whether
  it landed in blocks still held for the registration, and a WRITE landing in
  blocks D handed to another request is an I15 violation; the write completion
  ``<d_id>:<n>`` follows it;
* D, not P, decides the use: each D rank feeds its table's verdict, P's aborts,
  its releases and the agents it forgets to a real
  :class:`~leaseproto.core.push.PushRegistrations`, and returns to its pool
  (at once: the worst case) exactly the blocks ``take_free`` names;
* P giving up (an ``NK``, or an ``LL`` before any WRITE) or aborting sends
  ``AB`` from each writer rank that has not written (so D's quarantine ends);
  P may pause past the registration; a crashed P is forgotten by D at any later
  instant (its transport noticed). D may cancel a registration itself (its
  client went away).

What is checked here (:mod:`.push_checks`) is I15; the mirrored I13 (D's
verdicts) is reported as I15 and I5, I6, I8, I11 as I16.
"""

from __future__ import annotations

from ..core import wire
from ..core.events import Release
from ..core.push import DISCARD, USE, PushRegistrations
from . import push_checks as pc
from .clone import clone_registrations
from .fingerprint import registrations_fp
from .ghosts import Action
from .scope import Scope
from .world import World

__all__ = ["PUSH_MIRRORED", "PushWorld", "make_world"]

#: the ids a violation in the push scope is reported by (spec §9: I15 is I13 for the
#: registration D grants, I16 is I5/I6/I8/I11 mirrored)
PUSH_MIRRORED = {"I13": "I15", "I5": "I16", "I6": "I16", "I8": "I16", "I11": "I16"}


class PushWorld(World):
    """Push mode; names as in :class:`~.world.World` (``P``: the grantor ranks,
    here D's; ``D``: the reader's ranks, here P's, the writers)."""

    mirrored = PUSH_MIRRORED
    case = "push"

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope)
        self.budget["cancel"] = scope.cancels
        #: each grantor rank's registrations (the product's use and quarantine decisions)
        self.regs = {p: PushRegistrations() for p in self.P}
        # -- ghosts ------------------------------------------------------------------------
        #: (grantor, request) -> held (registered) | used (decoding) | reused (another request's)
        self.blocks: dict[tuple[str, str], str] = {}
        #: (grantor, request) -> what D decided: use | discard
        self.decided: dict[tuple[str, str], str] = {}
        #: (grantor, request, writer): D handled the writer's completion or abort
        self.settled: set[tuple[str, str, str]] = set()
        #: (grantor, request, writer) -> the lease was live when D handled its completion
        self.done_live: dict[tuple[str, str, str], bool] = {}
        #: (grantor, writer): the grantor rank forgot the writer's agent
        self.forgotten: set[tuple[str, str]] = set()

    def copy(self) -> PushWorld:
        new = super().copy()
        assert isinstance(new, PushWorld)
        new.regs = {p: clone_registrations(g) for p, g in self.regs.items()}
        new.blocks = dict(self.blocks)
        new.decided = dict(self.decided)
        new.settled = set(self.settled)
        new.done_live = dict(self.done_live)
        new.forgotten = set(self.forgotten)
        return new

    def extra_fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(registrations_fp(self.regs[p]) for p in self.P),
            tuple(sorted(self.blocks.items())),
            tuple(sorted(self.decided.items())),
            tuple(sorted(self.settled)),
            tuple(sorted(self.done_live.items())),
            tuple(sorted(self.forgotten)),
        )

    # -- what can happen ------------------------------------------------------------------
    def _transfer_actions(self, r: str) -> list[Action]:
        return [
            ("write", r, d, p)
            for d in self.D
            for p in self.P
            if (r, d, p) not in self.reads and (p, r) in self.blocks
        ]

    def _p_actions(self, p: str) -> list[Action]:
        out = super()._p_actions(p)
        if any(q == p for q, _ in self.forgotten):  # D registers only with agents it knows
            out = [a for a in out if a[0] not in ("grant", "regrant")]
        if self.budget["cancel"] > 0:
            out += [("cancel", p, r) for r in self.R if r in self.tables[p]]
        if not self.d_alive and any(q == p for q, _ in self.blocks):
            # the writers' process died: D's transport may notice it from now on
            out += [("forget", p, w) for w in self.D if (p, w) not in self.forgotten]
        return out

    # -- applying -------------------------------------------------------------------------
    def apply(self, act: Action) -> None:
        super().apply(act)
        pc.check_quarantine_bounded(self)

    def _do_grant(self, p: str, r: str) -> None:
        self.regs[p].register(r, self.D)  # D registers its blocks with the writers
        self.blocks[(p, r)] = "held"
        super()._do_grant(p, r)

    def _do_write(self, r: str, d: str, p: str) -> None:
        """Writer ``d``'s WRITE into grantor ``p``'s blocks lands; its completion follows."""
        pc.check_landing(self, r, d, p)
        self.reads[(r, d, p)] = self.blocks.get((p, r)) == "held"
        self.send(d, p, wire.encode_transfer_done(r, self.readers()))

    def _do_cancel(self, p: str, r: str) -> None:
        """Grantor ``p`` ends the registration itself (D's request went away)."""
        self.budget["cancel"] -= 1
        rel = self.tables[p].abort(r, now=float(self.now))
        if isinstance(rel, Release):
            self.released(p, r, rel)

    def _do_forget(self, p: str, w: str) -> None:
        """Grantor ``p`` forgets the dead writer ``w`` (a failed send, a lost connection)."""
        self.forgotten.add((p, w))
        for r in self.regs[p].forget(w):
            self._decide(p, r, DISCARD)
        self._free(p)

    def released(self, p: str, r: str, rel: Release) -> None:
        super().released(p, r, rel)
        self._decide(p, r, self.regs[p].ended(r))
        self._free(p)

    def on_completion(self, p: str, src: str, r: str, *, ok: bool, live: bool) -> None:
        self.settled.add((p, r, src))
        self.done_live.setdefault((p, r, src), live)
        self._decide(p, r, self.regs[p].completion(r, src, ok=ok))
        self._free(p)

    def on_abort(self, p: str, src: str, r: str) -> None:
        self.settled.add((p, r, src))
        self._decide(p, r, self.regs[p].abort(r, src))
        self._free(p)

    def _decide(self, p: str, r: str, act: str) -> None:
        if act not in (USE, DISCARD):
            return
        pc.check_decision(self, p, r, act)
        self.decided[(p, r)] = act
        if act == USE:
            self.blocks[(p, r)] = "used"

    def _free(self, p: str) -> None:
        """The blocks the grantor returns to its pool, handed to another request at once."""
        for r in self.regs[p].take_free():
            pc.check_free(self, p, r)
            self.blocks[(p, r)] = "reused"

    def reader_used(self, r: str) -> None:
        """P's verdicts are all OK: its part is done (D decides the use)."""

    def untrack(self, r: str, phase: str) -> None:
        """P is done with ``r``. Giving up (an ``NK``, or an ``LL`` before any WRITE)
        or aborting, each writer rank that has not written to a D rank tells it so
        (``AB``), so that D's quarantine of the registration ends."""
        if phase in ("failed", "aborted"):
            for d in self.D:
                for p in self.P:
                    if (r, d, p) not in self.reads:
                        self.send(d, p, wire.encode_abort(r))
        super().untrack(r, phase)

    def _do_abort(self, r: str) -> None:
        self.untrack(r, "aborted")


def make_world(scope: Scope) -> World:
    """The world ``scope`` describes: push mode's, or the pull/turn-2 one."""
    return PushWorld(scope) if scope.push else World(scope)
