"""Which D agents may act for a lease on P: leases bound to their reader
(spec §10.2). The core cannot tell who sent a notification (§10.1); this
worker-layer record can, and P consults it before the core sees anything.

A lease is bound to a set of D agents:

* **named**: the router named the decode engine's agents in the ``prefill``
  request (``readers``, every rank's NIXL agent): the lease is bound to
  exactly them at the grant, before any D has heard of it;
* otherwise **trust on first use**: the first agent that acts for the lease
  (a heartbeat naming it, a transfer-done or an abort) binds it, together
  with the agents the router last named alongside that agent (its engine),
  if any.

A renewal, transfer-done or abort for a bound lease from an agent outside
its set is refused: counted by kind (:attr:`ReaderBinding.refused`) and
ignored (no renewal, no count, no verdict). Several D ranks legitimately act
for one lease under heterogeneous TP (readers ``n``, §2.4); the named set
holds all of them. An ended lease keeps its binding while P may still
remember it (as many as P keeps tombstones, oldest forgotten first), so a late
transfer-done or abort from another agent is refused too: it neither counts as
a late transfer nor earns the sender a verdict. An id P holds no binding for
(never granted, forgotten, or granted unnamed and not acted for yet) passes on
to the core, which counts it (late, unknown, staged) and frees nothing that is
live.

The record also keeps when each agent was last heard and which agents a
live lease is bound to, for :meth:`ReaderBinding.silent` (P forgets
decoders that hold no live lease and have said nothing for
``tombstone_ttl``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

__all__ = ["ACTS", "ReaderBinding"]

#: What a D agent does for a lease, as counted when refused.
ACTS = ("heartbeat", "transfer_done", "abort")


class ReaderBinding:
    """Lease id -> the D agents that may act for it, on one P rank."""

    def __init__(self, *, ended_capacity: int = 100_000) -> None:
        self._bound: dict[str, frozenset[str]] = {}
        #: ended leases' bindings, oldest first, at most ``ended_capacity``
        self._ended: OrderedDict[str, frozenset[str]] = OrderedDict()
        self.ended_capacity = ended_capacity
        #: each distinct set bound to, with how many live leases are bound to it
        self._groups: dict[frozenset[str], int] = {}
        #: agent -> the agents the router last named with it (its decode engine)
        self._engine: dict[str, frozenset[str]] = {}
        #: acts refused because the lease is bound to other agents, by kind
        self.refused: dict[str, int] = dict.fromkeys(ACTS, 0)
        #: agent -> when P last handled a notification from it (P's clock)
        self.last_heard: dict[str, float] = {}

    def __len__(self) -> int:
        """How many live leases are bound."""
        return len(self._bound)

    def bound(self, req_id: str) -> frozenset[str] | None:
        """The agents ``req_id`` (live, or ended and remembered) is bound to, or
        None while it is unbound."""
        return self._bound.get(req_id) or self._ended.get(req_id)

    def only_engine(self) -> frozenset[str] | None:
        """The one set every bound lease is bound to, or None (none bound, or
        several sets): with one decode engine, a heartbeat from one of its
        agents needs no check id by id."""
        if len(self._groups) != 1:
            return None
        return next(iter(self._groups))

    def _bind(self, req_id: str, group: frozenset[str]) -> None:
        old = self._bound.get(req_id)
        if old is not None:
            self._unbind(old)
        self._ended.pop(req_id, None)  # a re-grant (A7) is a new lease
        self._bound[req_id] = group
        self._groups[group] = self._groups.get(group, 0) + 1

    def _unbind(self, group: frozenset[str]) -> None:
        n = self._groups[group] - 1
        if n:
            self._groups[group] = n
        else:
            del self._groups[group]

    def name(self, req_id: str, agents: Iterable[str]) -> None:
        """Bind ``req_id`` at its grant to the agents the router named (no-op
        for none)."""
        group = frozenset(agents)
        if not group:
            return
        if any(self._engine.get(a) != group for a in group):
            for agent in group:  # the same engine's set is shared, not copied per lease
                self._engine[agent] = group
        self._bind(req_id, self._engine[next(iter(group))])

    def _engine_of(self, sender: str) -> frozenset[str]:
        return self._engine.get(sender) or frozenset((sender,))

    def admits(self, sender: str, req_id: str, *, live: bool, kind: str) -> bool:
        """Whether ``sender`` may act (``kind``, one of :data:`ACTS`) for
        ``req_id``; binds an unbound live lease to the sender's engine (trust on
        first use). A refusal is counted."""
        group = self._bound.get(req_id)
        if group is None:
            if live:
                self._bind(req_id, self._engine_of(sender))
                return True
            group = self._ended.get(req_id)
            if group is None:
                return True
        if sender in group:
            return True
        self.refused[kind] += 1
        return False

    def unbound_for(
        self, sender: str, ids: Iterable[str], live: Collection[str]
    ) -> list[str] | None:
        """For one heartbeat from ``sender`` (the fast path's check): the live
        ids it names that are still unbound (:meth:`bind` them once the
        heartbeat is taken), or None when it names a lease bound to other
        agents (the slow path then refuses and counts id by id)."""
        get = self._bound.get
        unbound: list[str] = []
        for rid in ids:
            group = get(rid)
            if group is None:
                if rid in live:
                    unbound.append(rid)
                    continue
                group = self._ended.get(rid)
            if group is not None and sender not in group:
                return None
        return unbound

    def bind(self, sender: str, ids: Iterable[str]) -> None:
        """Bind these unbound live ids to ``sender``'s engine, as :meth:`admits` would."""
        engine = self._engine_of(sender)
        for rid in ids:
            if rid not in self._bound:
                self._bind(rid, engine)

    def release(self, req_id: str) -> None:
        """The lease ended: its binding moves to the ended ones (the oldest of
        those is forgotten past ``ended_capacity``)."""
        group = self._bound.pop(req_id, None)
        if group is not None:
            self._unbind(group)
            if self.ended_capacity > 0:
                self._ended[req_id] = group
                if len(self._ended) > self.ended_capacity:
                    self._ended.popitem(last=False)

    def heard(self, sender: str, now: float) -> None:
        self.last_heard[sender] = now

    def silent(self, *, now: float, ttl: float, keep: Collection[str] = ()) -> list[str]:
        """Agents bound to no live lease, not in ``keep`` and unheard for ``ttl``
        seconds; they are forgotten here (the caller drops its own records of
        them). ``keep``: agents the worker still uses otherwise (P reading a D's
        cached turn)."""
        busy: set[str] = set(keep)
        for group in self._groups:
            busy |= group
        gone = [a for a, t in self.last_heard.items() if now - t >= ttl and a not in busy]
        for agent in gone:
            self.forget(agent)
        return gone

    def forget(self, agent: str) -> None:
        """Drop what is kept of ``agent`` (its engine, when it was last heard)."""
        self.last_heard.pop(agent, None)
        self._engine.pop(agent, None)
