"""P's record of who may act for a lease, and of the decoders it can notify. No vLLM import.

**Leases bound to their reader** (trust on first use, no key needed, so it
works with stock vLLM decoders). The first D agent to act for a lease (a
heartbeat naming it while it is live, or a transfer-done) binds it. With
D TP > P TP several D ranks read one P rank and all of them heartbeat it: they
act in the same engine steps, so other agents may join the binding during
``join_window`` seconds after the first act (the heartbeat interval): by a
heartbeat while no bound agent has sent a transfer-done yet, by a heartbeat or
a transfer-done while fewer agents are bound than the readers ``n`` the first
bound transfer-done stated. After that only bound agents renew, complete or
abort the lease; anything another agent sends for it is counted and ignored.
An abort never binds: it is taken only from a bound agent. (A stock D rank
whose first act is its transfer-done, handled before its sibling's, is not
bound: P ignores it, so the lease ends by expiry, never early.) A binding is kept while the
lease is live or remembered (its tombstone), so a late transfer-done from a
stranger is ignored too.

**Decoders P can notify.** A hello loads the greeting D agent's NIXL metadata
so P can send it verdicts. :class:`Greeters` remembers each loaded agent and
when P last heard from it; :meth:`Greeters.silent` names those to forget: no
live lease bound to them and nothing heard for ``ttl`` (the tombstone ttl).
The worker removes their NIXL agents. D greets again before it reads after a
silence (see the worker), so a forgotten decoder that comes back is loaded
again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Greeters", "ReaderBindings"]


@dataclass
class _Binding:
    opened: float
    agents: set[str] = field(default_factory=set)
    capacity: int | None = None  # readers stated by the first bound transfer-done


class ReaderBindings:
    """Lease id -> the D agents that may act for it."""

    def __init__(self, join_window: float, *, max_agents: int = 64) -> None:
        self.join_window = join_window
        self.max_agents = max_agents
        self.ignored = 0  # acts from an agent the lease is not bound to
        self._bound: dict[str, _Binding] = {}
        self._by_agent: dict[str, set[str]] = {}

    def admit(self, req_id: str, agent: str, *, now: float, act: str, readers: int = 1) -> bool:
        """May ``agent`` do ``act`` (``"heartbeat"``, ``"transfer"`` with the
        transfer-done's ``readers``, or ``"abort"``) for ``req_id`` now?"""
        b = self._bound.get(req_id)
        if b is None:
            if act == "abort":  # an abort never binds
                self.ignored += 1
                return False
            b = self._bound[req_id] = _Binding(now)
            self._bind(req_id, b, agent)
        elif agent not in b.agents and not self._may_join(b, act, now):
            self.ignored += 1
            return False
        elif agent not in b.agents:
            self._bind(req_id, b, agent)
        if act == "transfer" and b.capacity is None:
            b.capacity = readers  # stated by a bound agent: how many may read
        return True

    def _may_join(self, b: _Binding, act: str, now: float) -> bool:
        if act == "abort" or now - b.opened >= self.join_window:
            return False
        if b.capacity is None:
            # a heartbeat may join; a transfer-done waits until a bound agent
            # said how many read (else a stranger's would complete the lease
            # between D's heartbeat and D's own transfer-done)
            return act == "heartbeat" and len(b.agents) < self.max_agents
        return len(b.agents) < min(b.capacity, self.max_agents)

    def agents(self, req_id: str) -> set[str]:
        b = self._bound.get(req_id)
        return set() if b is None else set(b.agents)

    def leases_of(self, agent: str) -> set[str]:
        return set(self._by_agent.get(agent, ()))

    def prune(self, keep: Callable[[str], bool]) -> int:
        """Drop the bindings of every lease ``keep`` says is gone; how many."""
        gone = [rid for rid in self._bound if not keep(rid)]
        for rid in gone:
            for agent in self._bound.pop(rid).agents:
                ids = self._by_agent.get(agent)
                if ids is not None:
                    ids.discard(rid)
                    if not ids:
                        del self._by_agent[agent]
        return len(gone)

    def __len__(self) -> int:
        return len(self._bound)

    def _bind(self, req_id: str, b: _Binding, agent: str) -> None:
        b.agents.add(agent)
        self._by_agent.setdefault(agent, set()).add(req_id)


class Greeters:
    """D agents whose hello P loaded, and when P last heard from each."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._names: dict[str, str] = {}  # sender -> the NIXL agent name loaded
        self._heard: dict[str, float] = {}
        self._swept = -math.inf

    def __contains__(self, agent: object) -> bool:
        return agent in self._names

    def __len__(self) -> int:
        return len(self._names)

    def add(self, agent: str, name: str, *, now: float) -> None:
        self._names[agent] = name
        self._heard[agent] = now

    def heard(self, agent: str, *, now: float) -> None:
        if agent in self._names:
            self._heard[agent] = max(self._heard[agent], now)

    def silent(self, *, now: float, busy: Callable[[str], bool]) -> list[tuple[str, str]]:
        """``(agent, loaded name)`` of each greeter with nothing heard for
        ``ttl`` and not ``busy`` (a live lease bound to it); checked at most
        once a second. The caller removes them (:meth:`forget`)."""
        if now - self._swept < min(1.0, self.ttl):
            return []
        self._swept = now
        return [
            (a, self._names[a])
            for a, t in self._heard.items()
            if now - t >= self.ttl and not busy(a)
        ]

    def forget(self, agents: Iterable[str]) -> None:
        for agent in agents:
            self._names.pop(agent, None)
            self._heard.pop(agent, None)
