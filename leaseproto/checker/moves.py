"""What can happen in a state of the checked world: the actions each side may
take next (:class:`~.world.World` takes them).

Each instant runs in turns, as the workers' loops do: the network decides every
message in flight (arrives now, stays in flight, is lost or duplicated), then
each grantor rank takes its turn (grants, then its loop step: every arrived
notification in arrival order, then expire), then the reader (its arrived
verdicts, then routes, reads, aborts and faults, then its heartbeat step), then
time ticks. A message takes at least one tick, so turns of different sides
commute and fixing their order loses nothing.
"""

from __future__ import annotations

from ..core import wire
from ..core.table import LeaseTable
from . import giveups, glue
from .ghosts import Action, Instance, Msg
from .scope import Scope

__all__ = ["Moves"]


class Moves:
    """The actions of :class:`~.world.World` (a base class: the state is the world's)."""

    scope: Scope
    P: list[str]
    D: list[str]
    R: list[str]
    now: int
    turn: int
    tables: dict[str, LeaseTable]
    net: list[Msg]
    undecided: list[Msg]
    inbox: dict[str, list[Msg]]
    granted_now: dict[str, set[str]]
    budget: dict[str, int]
    inst: dict[tuple[str, str], list[Instance]]
    phase: dict[str, str]
    first_grant: dict[str, int]
    reads: dict[tuple[str, str, str], bool]
    hello: dict[str, int]
    pending: set[str]
    d_alive: bool
    d_received: bool
    paused_until: int
    gave_up: dict[str, tuple[int, frozenset[str]]]
    cancelled: set[tuple[str, str]]

    def paused(self) -> bool:
        return self.now < self.paused_until

    def d_acts(self) -> bool:
        return self.d_alive and not self.paused()

    def actions(self) -> list[Action]:
        if self.undecided:
            return self._net_actions()
        if self.turn < len(self.P):
            return self._p_actions(self.P[self.turn])
        return self._d_actions()

    def _net_actions(self) -> list[Action]:
        out: list[Action] = []
        seen: set[Msg] = set()
        for i, m in enumerate(self.undecided):
            if m in seen:
                continue
            seen.add(m)
            out.append(("arrive", i))
            if self.now - m.sent < self.scope.delay:
                out.append(("hold", i))
            if self.budget["loss"] > 0 and m.data.startswith(wire.HEARTBEAT_PREFIX):
                out.append(("lose", i))
            if self.budget["dup"] > 0:
                out.append(("dup", i))
        return out

    def _p_actions(self, p: str) -> list[Action]:
        out: list[Action] = []
        if p not in self.granted_now:
            table = self.tables[p]
            for r in self.R:
                insts = self.inst.get((p, r), [])
                if (
                    r not in self.granted_now.get(p, ())
                    and (p, r) not in self.cancelled
                    and (
                        not insts
                        or (
                            not insts[-1].live
                            and self.budget["regrant"] > 0
                            and r not in table
                            and self._unique_again(p, r)
                        )
                    )
                ):
                    out.append(("regrant" if insts else "grant", p, r))
        if self.budget["restart"] > 0:
            out.append(("p_restart", p))
        out.append(("p_step", p))
        return out

    def _unique_again(self, p: str, r: str) -> bool:
        """A7 (spec §3.3): ``r`` may name a new grant on ``p`` only once nothing of
        its last lease there can still act: D holds nothing of it (routed or
        tracked: D would read the new blocks with the old lease's parameters, or
        send a transfer-done that vouches for a read of the old ones), ``p`` has
        staged nothing naming it (the grant would apply it), and no notification
        naming it is in flight to ``p`` or waiting in its inbox."""
        if not self.scope.unique_ids:
            return True
        if self.phase[r] in ("new", "tracked") or r in self.tables[p]._staged:
            return False
        mine = [m for m in (*self.net, *self.undecided) if m.dst == p]
        return not any(r in glue.names(m) for m in (*mine, *self.inbox.get(p, ())))

    def _d_actions(self) -> list[Action]:
        if not self.d_received and self.d_acts():
            return [("d_recv",)]
        # the router's give-ups (scope ``router``): at D's turn, also while D is gone
        out: list[Action] = giveups.actions(self) if self.scope.router else []
        if not self.d_acts():
            return [*out, ("tick",)]
        late = False
        for r in self.R:
            ph = self.phase[r]
            if ph == "new" and r in self.first_grant and r not in self.gave_up:
                out.append(("route", r))
                if self.scope.router:  # D refuses it at intake and answers ok = false
                    out.append(("refuse", r))
                late = late or self.now - self.first_grant[r] >= 1
            if ph == "tracked":
                out += self._transfer_actions(r)
                if self.scope.aborts:
                    out.append(("abort", r))
        for p in self.P:
            if self.scope.gate and p not in self.hello:
                out.append(("hello", p))
            if p in self.pending:
                out.append(("reconnect", p))
            elif self.budget["reconnect"] > 0:
                out.append(("disconnect", p))
        if self.scope.d_crash:
            out.append(("d_crash",))
        if self.budget["pause"] > 0:
            out.append(("d_pause",))
        if not late:  # the router hands a granted request to D within a tick (R = 1)
            out.append(("d_step",))
        return out

    def _transfer_actions(self, r: str) -> list[Action]:
        """The reader's reads of ``r`` not made yet (through the gate in scopes with one)."""
        return [
            ("read", r, d, p)
            for d in self.D
            for p in self.P
            if (r, d, p) not in self.reads and (not self.scope.gate or glue.gate_admits(self, r, p))
        ]

    def label(self, act: Action) -> str:
        name, *args = act
        if name in ("arrive", "hold", "lose", "dup"):
            m = self.undecided[args[0]]
            return f"t={self.now} {name} {m.src}->{m.dst} {m.data.decode(errors='replace')!r}"
        return f"t={self.now} {name} {' '.join(map(str, args))}".rstrip()
