"""D's push registrations: when pushed KV may be used, and when its blocks may be
reused (spec §2.8, I15). Pure: no clock, no I/O.

In push mode D registers blocks with the prefill agents that will WRITE into them
(the *writers*: one per P rank that writes to this D rank) and grants a lease on
the registration in its own :class:`~leaseproto.core.table.LeaseTable`
(``ttl = push_registration_timeout``). The table decides liveness: renewals by
P's heartbeats, expiry, and the verdict for each write completion
(:func:`~leaseproto.core.wire.verdict`: ``OK`` iff the registration was live
when D handled it). :class:`PushRegistrations` decides the two things the table
cannot:

* **use** (the fence): D uses the pushed KV only once every writer's completion
  was answered ``OK`` -- the same rule as a decode rank's reads waiting for
  every P rank's ``OK`` (I13). An ``NK``, a writer's abort, the registration
  ending first, or a writer forgotten makes D discard it (recompute).
* **quarantine**: a registration that ended before every writer's completion or
  abort was handled keeps its blocks out of D's pool, since a writer that was
  granted them may still be writing (an RDMA WRITE is not fenced by its
  target). They go back by the first of: each such writer's completion or abort
  handled, or its agent forgotten (a failed send, a lost connection, a removed
  peer). The watchdog-only design frees them at the lapse, and a late WRITE
  lands in another request's KV.

How the connector calls it, per D rank (the order matters only for liveness; no
order makes it use KV it should not)::

    regs.register(d_id, writers)                   # with PUSH_REG; table.grant(d_id, ...)
    out, verdict = ..., wire.verdict(d_id, out)     # a completion <d_id>:<n> from writer w
    regs.completion(d_id, w, ok=isinstance(verdict, wire.Ok))   # USE / WAIT / DISCARD / IGNORE
    regs.abort(d_id, w)                             # AB:<d_id> from writer w
    regs.ended(d_id)                                # each Release of d_id the table returns
                                                    # (wait=False: its writers are stock)
    regs.forget(agent)                              # D forgot a writer's agent
    for d_id in regs.take_free(): ...               # return these blocks to D's pool

Call :meth:`~PushRegistrations.completion` before :meth:`~PushRegistrations.ended`
for a Release the same ``transfer_done`` returned: after ``ended`` nothing is
used (a good completion handled later only costs a recompute).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import LocalProtocolError

__all__ = ["DISCARD", "IGNORE", "USE", "WAIT", "PushRegistrations"]

#: what D does with the pushed KV after one input (the decode worker's verdict
#: decisions use the same words: a read waits for every OK, an NK discards it)
IGNORE, WAIT, USE, DISCARD = "ignore", "wait", "use", "discard"


@dataclass(slots=True)
class _Registration:
    #: writers whose completion or abort D has not handled, and who are not forgotten
    owed: set[str]
    #: the pushed KV will not be used (an NK, an abort, a lapse, a writer forgotten)
    failed: bool = False
    #: D's table released the registration lease
    ended: bool = False


class PushRegistrations:
    """One D rank's push registrations (see the module's docstring)."""

    def __init__(self) -> None:
        self._regs: dict[str, _Registration] = {}
        self._free: list[str] = []

    def register(self, lease_id: str, writers: Iterable[str]) -> None:
        """D registered blocks under ``lease_id`` with ``writers`` (the P agents
        that will WRITE into them).

        Raises:
            LocalProtocolError: ``lease_id`` is registered already, or ``writers``
                is empty.
        """
        names = frozenset(writers)
        if lease_id in self._regs:
            raise LocalProtocolError(f"push registration {lease_id!r} is registered already")
        if not names:
            raise LocalProtocolError(f"push registration {lease_id!r} names no writer")
        self._regs[lease_id] = _Registration(set(names))

    def completion(self, lease_id: str, writer: str, *, ok: bool) -> str:
        """D handled ``writer``'s write completion; ``ok`` is the verdict D's table
        gave it (``OK``: the registration was live). :data:`USE` once every
        writer's completion was ``OK``, :data:`WAIT` for the others,
        :data:`DISCARD` the first time the KV cannot be used, :data:`IGNORE` a
        duplicate, a writer not registered, or a registration already decided."""
        reg = self._regs.get(lease_id)
        if reg is None or writer not in reg.owed:
            return IGNORE
        reg.owed.discard(writer)
        if ok and not reg.failed:
            if reg.owed:
                return WAIT
            del self._regs[lease_id]  # the request owns the blocks now
            return USE
        return self._fail(lease_id, reg)

    def abort(self, lease_id: str, writer: str) -> str:
        """D handled ``writer``'s abort (it will not write): :data:`DISCARD` the
        first time, else :data:`IGNORE`."""
        reg = self._regs.get(lease_id)
        if reg is None or writer not in reg.owed:
            return IGNORE
        reg.owed.discard(writer)
        return self._fail(lease_id, reg)

    def ended(self, lease_id: str, *, wait: bool = True) -> str:
        """D's table released the registration lease (expired, aborted, or
        transferred with a writer still owed): :data:`DISCARD` if the KV was
        still awaited, else :data:`IGNORE`. Its blocks stay quarantined while a
        writer is owed.

        ``wait=False``: D does not wait for the writers still owed, because
        they never said they would complete or abort (a stock vLLM P, which
        never says ``leaseproto/1``; spec §2.8 "Stock peers"): they are owed
        nothing more and the blocks are free at once, unverified (such a P
        that writes later may overwrite them)."""
        reg = self._regs.get(lease_id)
        if reg is None or reg.ended:
            return IGNORE
        reg.ended = True
        if not wait:
            reg.owed.clear()
        return self._fail(lease_id, reg)

    def forget(self, agent: str) -> list[str]:
        """D forgot ``agent``: it is owed nothing more. Returns the registrations
        whose KV is now discarded (they waited for it)."""
        out: list[str] = []
        for lease_id, reg in list(self._regs.items()):
            if agent in reg.owed:
                reg.owed.discard(agent)
                if self._fail(lease_id, reg) == DISCARD:
                    out.append(lease_id)
        return out

    def take_free(self) -> list[str]:
        """The registrations whose blocks may go back to D's pool now (each once)."""
        out, self._free = self._free, []
        return out

    def quarantined(self) -> list[str]:
        """Registrations that ended while a writer may still write."""
        return [r for r, reg in self._regs.items() if reg.ended and reg.owed]

    def owed(self, lease_id: str) -> frozenset[str]:
        """The writers of ``lease_id`` that may still write (empty if unknown)."""
        reg = self._regs.get(lease_id)
        return frozenset() if reg is None else frozenset(reg.owed)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._regs

    def __len__(self) -> int:
        return len(self._regs)

    def _fail(self, lease_id: str, reg: _Registration) -> str:
        first = not reg.failed
        reg.failed = True
        if reg.ended and not reg.owed:
            del self._regs[lease_id]
            self._free.append(lease_id)
        return DISCARD if first else IGNORE
