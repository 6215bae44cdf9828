"""The transition rules, written once (spec §8 pseudocode).

Each rule is a small pure function of (state, input, now, config values). The
runtime (:mod:`.table`, :mod:`.tracker`, :mod:`.clock`) calls them on
floats; ``proofs/`` calls the *same functions* on z3 terms. Where a hot loop
needs a rule without a call per item (the renewals of :mod:`.renewal`, the
reaper's :func:`.table.expire_end`), the loop is ordinary code beside it, and
``proofs/loops.py`` runs that code on z3 terms to prove it does what the rule
says (lemma L14). The rules are written
with :mod:`.sym` (``ite``, ``vmax``, ``vmin``, ``conj``) and plain arithmetic
and comparisons, which both kinds of value support. States are the integer
values of :class:`~leaseproto.core.state.LeaseState`; the discrete part of every
rule is read from :data:`~leaseproto.core.state.TRANSITIONS`.

Keep these functions free of Python control flow on their arguments: an ``if``
on a symbolic value would silently pick one branch in the proofs.
"""

from __future__ import annotations

from .state import TRANSITIONS, Guard, Input, LeaseState, Transition
from .sym import conj, ite, neg, vmax, vmin

__all__ = [
    "ABORTED",
    "ABSENT",
    "EXPIRED",
    "GRANTED",
    "NO_ROW",
    "TRANSFERRED",
    "abort_state",
    "aged_uncertainty",
    "expire_due",
    "expire_state",
    "grant_deadline",
    "heartbeat_due",
    "next_state",
    "read_allowed",
    "renew_applies",
    "renew_deadline",
    "renew_lost",
    "renew_rule",
    "transfer_done_count",
    "transfer_done_state",
    "transfer_is_last",
    "transfer_verdict_ok",
]

#: Numbers are floats at runtime and z3 ``ArithRef`` terms in ``proofs/``; conditions
#: are bools and z3 ``BoolRef``. The annotations name the runtime types.
N = float

ABSENT = int(LeaseState.ABSENT)
GRANTED = int(LeaseState.GRANTED)
TRANSFERRED = int(LeaseState.TRANSFERRED)
EXPIRED = int(LeaseState.EXPIRED)
ABORTED = int(LeaseState.ABORTED)
#: What the symbolic :func:`next_state` yields for a pair with no row (no state).
NO_ROW = -1


def _src(row: tuple[LeaseState, Transition]) -> int:
    return int(row[0])


def next_state(state: int, inp: Input, guard: bool) -> int:
    """The state after ``inp`` per :data:`TRANSITIONS`, given the guard's value.

    On a concrete ``state`` this is a table lookup (``KeyError`` for a pair the
    table does not allow); on a symbolic one it is the ``ite`` chain over every
    row for ``inp``, and a state with no row for ``inp`` goes to :data:`NO_ROW`,
    which is no state: the proofs' well-formedness lemma (L0) then fails, as the
    runtime's lookup would, instead of reading a missing row as "unchanged".
    """
    if isinstance(state, int):
        # int keys find the IntEnum rows (equal hashes and values), without a
        # LeaseState() call on the runtime's path
        t = TRANSITIONS[(state, inp)]  # type: ignore[index]
        if t.guard is Guard.ALWAYS:
            return int(t.target)
        return ite(guard, int(t.target), state)
    # rows in the states' order, not the dict's: the same table gives the same
    # term, so z3's work does not change when a row is deleted and put back (which
    # moves it last) and an obligation cannot drift past its timeout
    rows = sorted(((src, t) for (src, i), t in TRANSITIONS.items() if i is inp), key=_src)

    def target(src: LeaseState, t: Transition) -> int:
        return int(t.target) if t.guard is Guard.ALWAYS else ite(guard, int(t.target), int(src))

    # every row is tested (none is the default): the term then means the same
    # whatever the table's order, and a value that is no state goes to NO_ROW
    result = NO_ROW
    for src, t in rows:
        result = ite(state == int(src), target(src, t), result)
    return result


# -- grant (spec §8.1) --------------------------------------------------------------------
def grant_deadline(now: N, ttl: N) -> N:
    """I5: a fresh lease ends by ``granted_at + ttl`` unless renewed."""
    return now + ttl


# -- renew (spec §8.2; I1 monotone, I2 no revival, I7 cap) --------------------------------
def renew_rule(state: int, deadline: N, cap_at: N | None, now: N, extension: N) -> tuple[bool, N]:
    """One heartbeat naming a lease: ``(applies, deadline')``.

    It applies only to a granted lease that is still live (``now < deadline``),
    so a renewal never creates or revives a lease (I2). Then ``deadline' =
    max(deadline, min(now + extension, cap_at))``: never shorter (I1), never
    past the cap (I7). Otherwise ``deadline`` is unchanged. The runtime calls
    this; :func:`renew_applies` and :func:`renew_deadline` are its two halves,
    for the proofs.
    """
    applies = conj(state == GRANTED, now < deadline)
    target = now + extension
    if cap_at is not None:  # a structural option, not a symbolic value
        target = vmin(target, cap_at)
    return applies, ite(applies, vmax(deadline, target), deadline)


def renew_applies(state: int, deadline: N, now: N) -> bool:
    """Whether a heartbeat renews the lease (first half of :func:`renew_rule`)."""
    return renew_rule(state, deadline, None, now, now)[0]


def renew_deadline(state: int, deadline: N, cap_at: N | None, now: N, extension: N) -> N:
    """The deadline after a heartbeat (second half of :func:`renew_rule`)."""
    return renew_rule(state, deadline, cap_at, now, extension)[1]


def renew_lost(state: int, applies: bool) -> bool:
    """Whether P reports a heartbeat id lost (the advisory ``LL``, spec §8.2): the
    renewal did not apply (``applies``, from :func:`renew_rule`) to a lease that
    lapsed (granted, past its deadline) or ended by expiry or abort. Not for an id
    P knows nothing of (``ABSENT``), nor one whose transfer completed."""
    return conj(neg(applies), state != ABSENT, state != TRANSFERRED)


# -- transfer-done (spec §8.3) ------------------------------------------------------------
def transfer_is_last(done: int, consumers: int) -> bool:
    """This notification completes the lease."""
    return done + 1 >= consumers


def transfer_done_state(state: int, done: int, consumers: int) -> int:
    return next_state(state, Input.RECV_TRANSFER_DONE, transfer_is_last(done, consumers))


def transfer_done_count(state: int, done: int) -> int:
    """Notifications are counted only while the lease is granted."""
    return ite(state == GRANTED, done + 1, done)


def transfer_verdict_ok(state: int) -> bool:
    """I13: a transfer-done is answered OK exactly when P handles it while the
    lease is granted (live); after it ended -- expired, aborted, or completed
    by earlier transfer-dones -- or before any grant it is answered NK."""
    return state == GRANTED


# -- abort (spec §8.4) --------------------------------------------------------------------
def abort_state(state: int) -> int:
    return next_state(state, Input.RECV_ABORT, True)


# -- expire (spec §8.5; I4) ---------------------------------------------------------------
def expire_due(state: int, deadline: N, now: N) -> bool:
    """A granted lease is due once ``deadline <= now``."""
    return conj(state == GRANTED, deadline <= now)


def expire_state(state: int, deadline: N, now: N) -> int:
    return next_state(state, Input.TIMER_EXPIRE, expire_due(state, deadline, now))


# -- decode side (spec §8.6) --------------------------------------------------------------
def heartbeat_due(last_sent: N, now: N, interval: N) -> bool:
    """An engine is due a heartbeat when its last one is ``interval`` old."""
    return now - last_sent >= interval


# -- bidirectional read gate (spec §8.7; I9) ----------------------------------------------
def read_allowed(remote_deadline: N, now: N, offset: N, uncertainty: N, margin: N) -> bool:
    """Reading blocks whose deadline is on the peer's clock is allowed only when
    ``now + margin + uncertainty < remote_deadline - offset``."""
    return now + margin + uncertainty < remote_deadline - offset


def aged_uncertainty(uncertainty: N, age: N, rho: N) -> N:
    """I9 under drift (A5): a sample's bound on the offset widens as it ages.
    Each clock runs within ``rho`` of real time, so ``age`` seconds on our
    clock since the sample (at most ``age / (1 - rho)`` real seconds) move the
    offset by at most ``2 rho / (1 - rho) * age`` (about ``2 rho * age``)."""
    return uncertainty + 2 * rho / (1 - rho) * age
