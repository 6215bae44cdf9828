"""Push registrations in a grantor D's trace (spec §2.8, I15; trace validation, §9.1).

D's push events, beside the grantor table's own (replayed by
:class:`~.trace_rules.PrefillReplay`):

* ``grant`` of ``kind`` ``push``, with ``writers`` (optional): the P agents the
  registration was sent to, which may WRITE into its blocks;
* ``handle`` of a write completion ``<d_id>:<n>`` or an abort ``AB:<d_id>`` from a
  writer: it *settles* that writer (it writes no more), whatever the verdict;
* ``forget`` (``agents``): D forgot these agents; the registrations granted
  before it are owed nothing more by them (a registration D grants them later
  owes them again, as in :class:`~leaseproto.core.push.PushRegistrations`);
* ``quarantine`` (``req``, ``writers``): the registration's lease ended while these
  writers may still write, and its blocks stay out of D's pool;
* ``unquarantine`` (``req``): the quarantined blocks go back to D's pool;
* ``use`` of ``kind`` ``push`` (``remote``: D's lease id): D uses the pushed KV.

I15 is checked on them: a ``use`` only after D's table handled a write
completion for the registration while it was live, from every writer when the
grant names them; a ``release`` of a registration whose writers are not all
settled or forgotten is followed by its ``quarantine`` naming them (before D's
next input), else D freed blocks a writer may still write (the watchdog-only
design); an ``unquarantine`` only once every writer of the quarantine settled or
was forgotten. A writer that never said ``leaseproto/1`` (its capability
heartbeat ``HB:leaseproto/1``, handled by D) before the release is not waited
for: a stock P never aborts, and D's fallback for it is unverified (§2.8 "Stock
peers"). A trace cut short may lack its last quarantine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core import wire
from ..core.rules import GRANTED
from ..core.state import LeaseState
from .trace_events import Event, Violation
from .trace_rules import PrefillReplay

__all__ = ["check_push_events", "push_use"]

#: the events a grantor's table takes as inputs: a release's quarantine comes before the next
INPUTS = frozenset({"grant", "abort_req", "handle", "expire", "end"})


@dataclass
class _Reg:
    """One push registration as D's trace tells it."""

    writers: frozenset[str] | None
    #: writers whose completion or abort D handled, or that D forgot since the grant
    settled: set[str] = field(default_factory=set)
    #: the writers named when it was quarantined (None: not quarantined)
    quarantine: set[str] | None = None


def _settles(e: Event) -> tuple[str, str, bool] | None:
    """(writer, lease id, whether a completion) when ``e`` is D handling a write
    completion or an abort."""
    if e.ev != "handle":
        return None
    try:
        msg = wire.decode(e.data())
    except wire.MalformedMessage:
        return None
    if not isinstance(msg, (wire.TransferDone, wire.Abort)):
        return None
    if msg.req_id in {str(i) for i in e.obj.get("refused", ())}:
        return None  # bound to other agents: ignored by the worker (§10.2)
    return str(e.obj.get("src")), msg.req_id, isinstance(msg, wire.TransferDone)


def _advertises(e: Event) -> bool:
    """Whether ``e`` (a ``handle``) is a heartbeat naming ``leaseproto/1``."""
    try:
        msg = wire.decode(e.data())
    except wire.MalformedMessage:
        return False
    return isinstance(msg, wire.Heartbeat) and wire.CAPABILITY in msg.ids


def _writers(e: Event) -> frozenset[str] | None:
    got = e.obj.get("writers")
    if got is None:
        return None
    if not isinstance(got, list) or not got:
        raise ValueError(f"a {e.ev} event whose writers is not a non-empty list")
    return frozenset(str(a) for a in got)


class _PushEvents:
    """The quarantine's half of I15, fed one grantor event at a time."""

    def __init__(self) -> None:
        self.out: list[Violation] = []
        self.regs: dict[str, _Reg] = {}
        #: agents whose capability heartbeat D handled (they complete or abort what they hold)
        self.peers: set[str] = set()
        #: releases whose quarantine is due before D's next input: id -> (release, owed)
        self.due: dict[str, tuple[Event, set[str]]] = {}

    def owed(self, reg: _Reg, names: Iterable[str]) -> set[str]:
        """Of ``names``, the writers that may still write (not settled, not forgotten)."""
        return set(names) - reg.settled

    def fail(self, inv: str, e: Event, msg: str) -> None:
        self.out.append(Violation(inv, e, msg))

    def feed(self, e: Event) -> None:
        o = e.obj
        if e.ev in INPUTS:
            for req, (rel, who) in self.due.items():
                self.fail(
                    "I15",
                    rel,
                    f"freed {req}'s blocks at its release while "
                    f"{sorted(who)[0]} may still write (no quarantine)",
                )
            self.due.clear()
        if e.ev == "grant" and o.get("kind") == "push":
            self.regs[str(o["req"])] = _Reg(_writers(e))
        elif (got := _settles(e)) is not None and got[1] in self.regs:
            self.regs[got[1]].settled.add(got[0])
        elif e.ev == "handle" and _advertises(e):
            self.peers.add(str(o["src"]))
        elif e.ev == "forget":
            agents = {str(a) for a in o["agents"]}
            for granted in self.regs.values():
                granted.settled |= agents
        elif e.ev == "release" and (reg := self.regs.get(str(o["req"]))) is not None:
            if reg.writers is not None and (who := self.owed(reg, reg.writers) & self.peers):
                self.due[str(o["req"])] = (e, who)
        elif e.ev == "quarantine":
            self.quarantine(e, str(o["req"]))
        elif e.ev == "unquarantine":
            req = str(o["req"])
            reg = self.regs.get(req)
            if reg is None or reg.quarantine is None:
                self.fail("format", e, f"an unquarantine of {req}, never quarantined")
            elif who := self.owed(reg, reg.quarantine):
                self.fail(
                    "I15",
                    e,
                    f"returned {req}'s blocks to the pool while {sorted(who)[0]} may still write",
                )

    def quarantine(self, e: Event, req: str) -> None:
        reg = self.regs.get(req)
        names = _writers(e)
        if reg is None or names is None:
            self.fail("format", e, f"a quarantine of {req}: not a push registration, or no writers")
            return
        _, who = self.due.pop(req, (e, set()))
        reg.quarantine = set(names) | who
        if missing := sorted(who - names):
            self.fail("I15", e, f"quarantined {req} without {missing[0]}, which may still write")


def check_push_events(events: list[Event]) -> list[Violation]:
    """The quarantine's half of I15 over one grantor's events (see the module);
    a malformed event is a ``format`` violation naming its line."""
    check = _PushEvents()
    for e in events:
        try:
            check.feed(e)
        except (KeyError, TypeError, ValueError) as exc:
            check.fail("format", e, f"a malformed {e.ev!r} event: {exc!r}")
    return check.out


def _completed(events: list[Event], remote: str) -> set[str]:
    """The writers whose write completion (not only an abort) for ``remote`` D handled."""
    out: set[str] = set()
    for h in events:
        got = _settles(h)
        if got is not None and got[1:] == (remote, True):
            out.add(got[0])
    return out


def push_use(
    events: list[Event], e: Event, remote: str, replay: PrefillReplay | None
) -> str | None:
    """I15's fence on the grantor D: what is wrong with using pushed KV for
    ``remote`` (its own registration lease) at ``e``, or None. D's own table must
    have handled a write completion for it while the registration was live, from
    every writer when its grant names them."""
    before = [h for h in events if h.line < e.line]
    grants = [g for g in before if g.ev == "grant" and str(g.obj.get("req")) == remote]
    try:
        writers = _writers(grants[-1]) if grants else None
    except ValueError:
        writers = None  # a format violation of the grant (check_push_events)
    completed = _completed(before, remote)
    got = [
        None if replay is None else replay.read_state.get((w, remote)) for w in sorted(completed)
    ]
    states = [st for st in got if st is not None]
    if not states:
        return f"used pushed KV of {remote} before handling a write completion for it"
    if any(st != GRANTED for st in states):
        bad = next(st for st in states if st != GRANTED)
        return (
            f"used pushed KV of {remote}, whose registration lease had ended when its "
            f"write completion was handled ({LeaseState(bad).name})"
        )
    missing = sorted((writers or frozenset()) - completed)
    if missing:
        return f"used pushed KV of {remote} before a write completion from {missing[0]}"
    return None
