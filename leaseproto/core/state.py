"""The per-lease state machine on P, as data (spec §6).

Theory of operation
-------------------
Rule 1: everything that decides *which state* a lease moves to lives in this
file, as the table :data:`TRANSITIONS`. Rule 2: what happens to the lease's
numbers (deadline, notification count) lives in :mod:`leaseproto.core.rules`,
written with :mod:`leaseproto.core.sym` so ``proofs/`` evaluates the very same
functions on z3 terms.

A lease starts ``ABSENT`` (no grant yet: P has not finished prefill, or D's
notification overtook the grant). ``GRANT`` makes it ``GRANTED``. From there it
ends exactly once, in one of three absorbing states: ``TRANSFERRED`` when the
last expected transfer-done notification arrives, ``ABORTED`` on D's abort, or
``EXPIRED`` when the timer finds ``deadline <= now``. Messages that reach an
ended lease are *late*: normal under reordering, counted, never raised; a
transfer-done after ``EXPIRED``/``ABORTED`` is reported to the caller because
the reader may have read reused blocks.

Each entry maps ``(state, input)`` to a :class:`Transition`: the target state
when its :class:`Guard` holds (otherwise the lease stays where it is) and a
short name of the effect, used by the diagrams in ``spec/`` and by the stats.
A pair missing from the table is local misuse (granting a live lease).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

__all__ = ["REGRANT", "TRANSITIONS", "Guard", "Input", "LeaseState", "Transition"]


class LeaseState(IntEnum):
    """States of one lease on P. Integers, so z3 models them as ``Int``."""

    #: No grant yet (or a fresh instance of a reused request id).
    ABSENT = 0
    #: Granted; blocks held until the deadline, a transfer-done or an abort.
    GRANTED = 1
    #: Ended: every expected transfer-done arrived; blocks freed.
    TRANSFERRED = 2
    #: Ended: the deadline passed with no renewal; blocks freed.
    EXPIRED = 3
    #: Ended: D aborted (rejected or cancelled the request); blocks freed.
    ABORTED = 4


#: States a lease ends in; each is absorbing.
ENDED_STATES = frozenset({LeaseState.TRANSFERRED, LeaseState.EXPIRED, LeaseState.ABORTED})

#: What a grant for an id whose lease has ended does (spec §6.1). It is not a
#: transition of the ended lease, which stays ended: P forgets its tombstone,
#: the id is ``ABSENT`` again (a new instance), and ``GRANT`` starts a new lease
#: from there. Request ids are unique per grant (A7), so no notification meant
#: for the old instance can reach the new one; a caller that re-grants on
#: purpose (vLLM overwrites an entry for the same request and blocks) keeps that.
REGRANT = "new lease: forget the tombstone, then ABSENT --grant--> GRANTED"


class Input(Enum):
    """What can happen to a lease."""

    #: Local: prefill finished, P grants the lease.
    GRANT = "grant"
    #: Remote: a heartbeat naming this request arrived (``HB:``).
    RECV_HEARTBEAT = "recv_heartbeat"
    #: Remote: one transfer-done notification arrived (``<id>:<n>``).
    RECV_TRANSFER_DONE = "recv_transfer_done"
    #: Remote: D aborted the request (``AB:``).
    RECV_ABORT = "recv_abort"
    #: Local: the reaper ran at ``now``.
    TIMER_EXPIRE = "timer_expire"


class Guard(Enum):
    """Conditions a transition may depend on; evaluated in :mod:`._rules`."""

    #: Unconditional.
    ALWAYS = "always"
    #: ``now < deadline``: the lease is still live, a renewal applies.
    LIVE = "now < deadline"
    #: ``done + 1 >= consumers``: this notification is the last expected one.
    LAST_CONSUMER = "done + 1 >= consumers"
    #: ``deadline <= now``: the lease is due.
    DUE = "deadline <= now"


@dataclass(frozen=True, slots=True)
class Transition:
    """Target state when ``guard`` holds, and the effect's name."""

    target: LeaseState
    guard: Guard
    effect: str


_S = LeaseState
_I = Input
_G = Guard

#: The transition table. Keys missing from it are local misuse.
TRANSITIONS: dict[tuple[LeaseState, Input], Transition] = {
    # -- before the grant ---------------------------------------------------------
    (_S.ABSENT, _I.GRANT): Transition(_S.GRANTED, _G.ALWAYS, "grant"),
    (_S.ABSENT, _I.RECV_HEARTBEAT): Transition(_S.ABSENT, _G.ALWAYS, "count unknown"),
    (_S.ABSENT, _I.RECV_TRANSFER_DONE): Transition(_S.ABSENT, _G.ALWAYS, "stage early"),
    (_S.ABSENT, _I.RECV_ABORT): Transition(_S.ABSENT, _G.ALWAYS, "stage early"),
    (_S.ABSENT, _I.TIMER_EXPIRE): Transition(_S.ABSENT, _G.ALWAYS, "nothing"),
    # -- live ------------------------------------------------------------------------
    (_S.GRANTED, _I.RECV_HEARTBEAT): Transition(_S.GRANTED, _G.LIVE, "renew"),
    (_S.GRANTED, _I.RECV_TRANSFER_DONE): Transition(_S.TRANSFERRED, _G.LAST_CONSUMER, "release"),
    (_S.GRANTED, _I.RECV_ABORT): Transition(_S.ABORTED, _G.ALWAYS, "release"),
    (_S.GRANTED, _I.TIMER_EXPIRE): Transition(_S.EXPIRED, _G.DUE, "release"),
    # -- ended: absorbing; late messages are counted ---------------------------------
    (_S.TRANSFERRED, _I.RECV_HEARTBEAT): Transition(_S.TRANSFERRED, _G.ALWAYS, "count late"),
    (_S.TRANSFERRED, _I.RECV_TRANSFER_DONE): Transition(_S.TRANSFERRED, _G.ALWAYS, "count excess"),
    (_S.TRANSFERRED, _I.RECV_ABORT): Transition(_S.TRANSFERRED, _G.ALWAYS, "count late"),
    (_S.TRANSFERRED, _I.TIMER_EXPIRE): Transition(_S.TRANSFERRED, _G.ALWAYS, "nothing"),
    (_S.EXPIRED, _I.RECV_HEARTBEAT): Transition(_S.EXPIRED, _G.ALWAYS, "count late"),
    (_S.EXPIRED, _I.RECV_TRANSFER_DONE): Transition(_S.EXPIRED, _G.ALWAYS, "report late"),
    (_S.EXPIRED, _I.RECV_ABORT): Transition(_S.EXPIRED, _G.ALWAYS, "count late"),
    (_S.EXPIRED, _I.TIMER_EXPIRE): Transition(_S.EXPIRED, _G.ALWAYS, "nothing"),
    (_S.ABORTED, _I.RECV_HEARTBEAT): Transition(_S.ABORTED, _G.ALWAYS, "count late"),
    (_S.ABORTED, _I.RECV_TRANSFER_DONE): Transition(_S.ABORTED, _G.ALWAYS, "report late"),
    (_S.ABORTED, _I.RECV_ABORT): Transition(_S.ABORTED, _G.ALWAYS, "count late"),
    (_S.ABORTED, _I.TIMER_EXPIRE): Transition(_S.ABORTED, _G.ALWAYS, "nothing"),
}
