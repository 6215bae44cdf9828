"""Lemma L14: the runtime's hot loops, run on z3 terms, do what the rules say.

The renewal loops of ``core/renewal.py`` (``renew_ids``, with its loop for a
heartbeat naming only live leases, and ``renew_capped``) and the reaper's ``expire_end`` of
``core/table.py`` are ordinary Python, written beside the rules they stand for.
Here that code is *run*: called on :class:`Sym` values, which wrap z3 terms.
Arithmetic and comparisons on them build terms; where the code branches on one
(an ``if``, an ``and``, a conditional expression), ``Sym.__bool__`` asks
:class:`Paths` which way to go. Each function is run once per path through it,
depth first (a run replays the choices of the one before and takes the other
way at the deepest choice left), and each run yields the path's condition and
what the code did: the deadlines and last renewals it stored, its counters, the
ids it reported lost, what it returned. The obligation says no path does
anything else than the rules (``renew_rule``, ``renew_lost``; ``expire_due``,
``expire_state``) applied to each id in turn: over reals and over IEEE doubles
(where ``==`` is identity of the value: ``-0.0`` is not ``0.0``).

So a change to a loop that changes what it does fails ``leaseproto prove``, and
so does a change to a rule the loop no longer follows. The loops run on the
table's live leases, which are GRANTED (the table takes a lease out of its live
map before it ends it; ``tests/test_hot_paths.py`` checks this over random
histories): that is the one hypothesis, and a tombstone's state is an end state.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import z3

from leaseproto.core import deadlines, renewal, table
from leaseproto.core import rules as R
from leaseproto.core.lease import Lease

SYSTEM = "loops"
ENDED = (R.TRANSFERRED, R.EXPIRED, R.ABORTED)


class Paths:
    """The choices of one run, and the runs of every path (see the module doc)."""

    def __init__(self) -> None:
        self.forced: list[bool] = []
        self.taken: list[bool] = []
        self.conds: list[Any] = []

    def decide(self, cond: Any) -> bool:
        i = len(self.taken)
        choice = self.forced[i] if i < len(self.forced) else True
        self.taken.append(choice)
        self.conds.append(cond if choice else z3.Not(cond))
        return choice

    def assume(self, cond: Any) -> None:
        """Adds ``cond`` to the path without a choice (what a fresh unknown is known to be)."""
        self.conds.append(cond)

    def runs(self, fn: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
        """``(path condition, fn's result)`` for every path through ``fn``."""
        self.forced = []
        while True:
            self.taken, self.conds = [], []
            result = fn()
            yield z3.And(*self.conds), result
            taken = self.taken
            while taken and not taken[-1]:
                taken.pop()
            if not taken:
                return
            self.forced = [*taken[:-1], False]


def _term(v: Any) -> Any:
    return v.t if isinstance(v, Sym) else v


class Sym:
    """A z3 term the loop computes with; branching on it is a choice of :class:`Paths`."""

    __slots__ = ("paths", "t")
    __hash__ = None  # type: ignore[assignment]  # == builds a term

    def __init__(self, t: Any, paths: Paths) -> None:
        self.t, self.paths = t, paths

    def _op(self, other: Any, f: Callable[[Any, Any], Any], *, flip: bool = False) -> Sym:
        a, b = self.t, _term(other)
        return Sym(f(b, a) if flip else f(a, b), self.paths)

    def __bool__(self) -> bool:
        return self.paths.decide(self.t)

    def __add__(self, o: Any) -> Sym:
        return self._op(o, operator.add)

    def __radd__(self, o: Any) -> Sym:
        return self._op(o, operator.add, flip=True)

    def __sub__(self, o: Any) -> Sym:
        return self._op(o, operator.sub)

    def __rsub__(self, o: Any) -> Sym:
        return self._op(o, operator.sub, flip=True)

    def __mul__(self, o: Any) -> Sym:
        return self._op(o, operator.mul)

    def __rmul__(self, o: Any) -> Sym:
        return self._op(o, operator.mul, flip=True)

    def __truediv__(self, o: Any) -> Sym:
        return self._op(o, operator.truediv)

    def __rtruediv__(self, o: Any) -> Sym:
        return self._op(o, operator.truediv, flip=True)

    def __lt__(self, o: Any) -> Sym:
        return self._op(o, operator.lt)

    def __le__(self, o: Any) -> Sym:
        return self._op(o, operator.le)

    def __gt__(self, o: Any) -> Sym:
        return self._op(o, operator.gt)

    def __ge__(self, o: Any) -> Sym:
        return self._op(o, operator.ge)

    def __eq__(self, o: object) -> Sym:  # type: ignore[override]
        return self._op(o, operator.eq)

    def __ne__(self, o: object) -> Sym:  # type: ignore[override]
        return self._op(o, operator.ne)


def _number(kind: str, name: str) -> Any:
    return z3.Real(name) if kind == "real" else z3.FP(name, z3.Float64())


@dataclass
class Check:
    """One obligation's formula: a disjunct per (case, path) that would differ from
    the rules, with a label each so a counterexample can be named."""

    hyps: list[Any]
    bad: list[tuple[str, Any]]
    error: str = ""
    #: a path was found on which the code plainly differs (the obligation fails)
    refuted: bool = False


def built(label: str, build: Callable[[], Check]) -> Check:
    """``build()``, or a failing check that names what the code raised: no input of
    the spec makes the code under proof raise outside its documented errors."""
    try:
        return build()
    except Exception as exc:
        return Check([], [], error=f"{label}: raised {type(exc).__name__}: {exc}"[:300])


# -- renewals (spec §8.2) ------------------------------------------------------------------
#: the ids of a heartbeat: ``a``, ``b`` name live leases, ``x`` a tombstone, ``u`` nothing
KINDS = "abxu"


def renew_check(kind: str, *, capped: bool, max_ids: int = 2) -> Check:
    """``renewal.renew_ids`` on every heartbeat of up to ``max_ids`` ids over
    :data:`KINDS` (duplicates included), with and without ``lost``, on the table's
    own :class:`~leaseproto.core.lease.Lease` records holding symbolic times."""

    def n(name: str) -> Any:
        return _number(kind, name)

    now, ext, cap = n("now"), n("extension"), n("max_lease_lifetime")
    var = {k: (n(f"deadline_{k}"), n(f"granted_at_{k}"), n(f"last_renewal_{k}")) for k in "ab"}
    tomb_state = z3.Int("tomb_state_x")
    other_deadline = n("deadline_x")  # what a rule is given for an id with no lease
    hyps = [z3.Or(*(tomb_state == s for s in ENDED))]
    state = {k: z3.Int(f"state_{k}") for k in "ab"}
    hyps += [state[k] == R.GRANTED for k in "ab"]  # the table's live map (module doc)
    check = Check(hyps, [])
    for size in range(1, max_ids + 1):
        for ids in itertools.product(KINDS, repeat=size):
            for with_lost in (True, False):
                label = f"ids {','.join(ids)}{'' if with_lost else ', lost=None'}"
                want = _renew_expected(
                    ids, var, state, tomb_state, other_deadline, now, ext, cap if capped else None
                )
                paths = Paths()

                def run(
                    ids: tuple[str, ...] = ids, with_lost: bool = with_lost, paths: Paths = paths
                ) -> Any:
                    return _renew_run(
                        ids, var, tomb_state, now, ext, cap if capped else None, with_lost, paths
                    )

                try:
                    for pc, got in paths.runs(run):
                        check.bad.append((label, z3.And(pc, _renew_differs(got, want, with_lost))))
                except Exception as exc:  # the loop did what no path can: the check fails
                    check.error = f"{label}: the loop raised {type(exc).__name__}: {exc}"
                    return check
    return check


def _renew_run(  # noqa: PLR0917
    ids: tuple[str, ...],
    var: dict[str, tuple[Any, Any, Any]],
    tomb_state: Any,
    now: Any,
    ext: Any,
    cap: Any,
    with_lost: bool,
    paths: Paths,
) -> dict[str, Any]:
    def s(t: Any) -> Sym:
        return Sym(t, paths)

    leases = {}
    for k, (d, g, last) in var.items():
        lease = Lease(k, s(g), s(d), seq=0)  # type: ignore[arg-type]
        lease.last_renewal = s(last)  # type: ignore[assignment]
        leases[k] = lease
    found = [leases.get(k) for k in ids]
    ended = {"x": (s(tomb_state), s(z3.Real("ended_at_x")))}
    lost: list[str] | None = [] if with_lost else None
    c = {"renew_unknown": 0, "renew_late": 0, "renew_lapsed": 0}
    every = all(found)
    # the product's loop, typed for floats, run as it is on symbolic values
    renew_ids: Any = renewal.renew_ids
    limit = None if cap is None else s(cap)
    renewed = renew_ids(list(ids), found, every, ended, s(now), s(ext), limit, lost, c)
    return {
        "renewed": renewed,
        "counters": dict(c),
        "lost": list(lost or []),
        "deadline": {k: _term(v.deadline) for k, v in leases.items()},
        "last_renewal": {k: _term(v.last_renewal) for k, v in leases.items()},
    }


def _renew_expected(  # noqa: PLR0917
    ids: tuple[str, ...],
    var: dict[str, tuple[Any, Any, Any]],
    state: dict[str, Any],
    tomb_state: Any,
    other_deadline: Any,
    now: Any,
    ext: Any,
    cap: Any,
) -> dict[str, Any]:
    """The rules applied to each id in turn: what the loop must do (a lease's cap is
    ``granted_at + max_lease_lifetime``, as ``grant`` computes it)."""
    deadline = {k: d for k, (d, _, _) in var.items()}
    last = {k: lr for k, (_, _, lr) in var.items()}
    renewed: list[Any] = []
    counts: dict[str, list[Any]] = {"renew_unknown": [], "renew_late": [], "renew_lapsed": []}
    lost: list[tuple[str, Any]] = []
    for rid in ids:
        if rid in var:
            st, d = state[rid], deadline[rid]
            cap_at = None if cap is None else var[rid][1] + cap
        else:
            st = tomb_state if rid == "x" else R.ABSENT
            d, cap_at = other_deadline, None
        applies, new = R.renew_rule(st, d, cap_at, now, ext)
        if rid in var:
            deadline[rid] = new
            last[rid] = z3.If(applies, now, last[rid])
        renewed.append(applies)
        counts["renew_lapsed"].append(z3.And(st == R.GRANTED, z3.Not(applies)))
        counts["renew_late"].append(z3.Or(*(st == e for e in ENDED)))
        counts["renew_unknown"].append(st == R.ABSENT)
        lost.append((rid, R.renew_lost(st, applies)))
    return {
        "renewed": _count(renewed),
        "counters": {k: _count(v) for k, v in counts.items()},
        "lost": lost,
        "deadline": deadline,
        "last_renewal": last,
    }


def _count(conds: list[Any]) -> Any:
    return z3.Sum(*(z3.If(c, 1, 0) for c in conds)) if conds else z3.IntVal(0)


def _renew_differs(got: dict[str, Any], want: dict[str, Any], with_lost: bool) -> Any:
    diffs = [want["renewed"] != got["renewed"]]
    diffs += [want["counters"][k] != got["counters"][k] for k in want["counters"]]
    for field in ("deadline", "last_renewal"):
        diffs += [z3.Not(got[field][k] == want[field][k]) for k in want[field]]
    if with_lost:
        diffs.append(z3.Not(_lost_is(want["lost"], got["lost"])))
    return z3.Or(*diffs)


def _lost_is(want: list[tuple[str, Any]], got: list[str]) -> Any:
    """``got`` (a run's concrete list) is the ids of ``want`` whose condition holds, in
    order."""

    def match(j: int, m: int) -> Any:
        if j == len(want):
            return z3.BoolVal(m == len(got))
        rid, cond = want[j]
        take = match(j + 1, m + 1) if m < len(got) and got[m] == rid else z3.BoolVal(False)
        return z3.If(cond, take, match(j + 1, m))

    return match(0, 0)


# -- expiry (spec §8.5) --------------------------------------------------------------------
def expire_check(kind: str) -> Check:
    """``table.expire_end`` against ``expire_due`` and ``expire_state``, any state."""
    st, deadline, now = z3.Int("state"), _number(kind, "deadline"), _number(kind, "now")
    due = R.expire_due(st, deadline, now)
    end = R.expire_state(st, deadline, now)
    check = Check([], [])
    paths = Paths()

    def run() -> Any:
        return table.expire_end(Sym(st, paths), Sym(deadline, paths), Sym(now, paths))  # type: ignore[arg-type]

    try:
        for pc, result in paths.runs(run):
            got = _term(result)
            differs = due if got is None else z3.Or(z3.Not(due), end != got)
            check.bad.append(("expire_end", z3.And(pc, differs)))
        _expire_monotone(check, kind, st, deadline, now)
    except Exception as exc:
        check.error = f"expire_end raised {type(exc).__name__}: {exc}"
    return check


def _expire_monotone(check: Check, kind: str, st: Any, later: Any, now: Any) -> None:
    """``table.expire_end`` run twice: what it expires at deadline ``later`` it expires
    at every ``earlier <= later`` too (``expire`` asks it once per state, at the latest
    deadline of a burst)."""
    earlier = _number(kind, "deadline_earlier")
    paths = Paths()

    def run() -> Any:
        def call(d: Any) -> Any:
            return table.expire_end(Sym(st, paths), Sym(d, paths), Sym(now, paths))  # type: ignore[arg-type]

        return _term(call(later)), _term(call(earlier))

    def expired(got: Any) -> Any:
        return z3.BoolVal(False) if got is None else z3.BoolVal(True) & (got == R.EXPIRED)

    for pc, (at_later, at_earlier) in paths.runs(run):
        bad = z3.And(pc, earlier <= later, expired(at_later), z3.Not(expired(at_earlier)))
        check.bad.append(("expire_end at an earlier deadline", bad))


# -- the grants' order (spec §8.5) -----------------------------------------------------------
def grants_check(kind: str) -> Check:
    """``DeadlineQueue._granted_until``, the deadline a lease of the queue's list of
    grants is taken at (by bisection: ``DeadlineQueue.grant`` keeps the list in the
    order of these deadlines), run on z3 terms: it is the deadline ``grant`` gives
    a lease granted for the default ttl, ``grant_deadline(granted_at, ttl)``."""
    ttl, g = _number(kind, "ttl"), _number(kind, "granted_at")
    check = Check([], [])
    paths = Paths()

    def run() -> Any:
        queue = deadlines.DeadlineQueue(Sym(ttl, paths))  # type: ignore[arg-type]
        return _term(queue._granted_until(Lease("a", Sym(g, paths), 0.0, seq=0)))  # type: ignore[arg-type]

    try:
        for pc, at in paths.runs(run):
            check.bad.append(("grant_deadline", z3.And(pc, z3.Not(at == R.grant_deadline(g, ttl)))))
    except Exception as exc:
        check.error = f"_granted_until raised {type(exc).__name__}: {exc}"
    return check


# -- the obligations -----------------------------------------------------------------------
def checks(only: str = "") -> list[tuple[str, Check]]:
    """Every check (those whose label contains ``only``), by its obligation's label;
    built now, from the current code."""
    todo: list[tuple[str, Callable[[], Check]]] = []
    for kind in ("real", "ieee"):
        for capped in (False, True):
            cap = "capped" if capped else "uncapped"
            todo.append(
                (
                    f"L14 renew loops = renew_rule, renew_lost ({cap}, {kind})",
                    functools.partial(renew_check, kind, capped=capped),
                )
            )
        todo.append(
            (
                f"L14 expire_end = expire_due, expire_state ({kind})",
                functools.partial(expire_check, kind),
            )
        )
        todo.append(
            (
                f"L14 the grants' deadlines = grant_deadline ({kind})",
                functools.partial(grants_check, kind),
            )
        )
    return [(label, build()) for label, build in todo if only in label]
