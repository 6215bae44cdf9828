"""Running the core's real code on z3 terms, path by path: the machinery of L15
(:mod:`proofs.structures`), L16 (:mod:`proofs.tracking`) and the clock's lemma.

:class:`Explorer` runs a function once per feasible path through the branches its
code takes on symbolic values (asking z3 at each branch which ways the path so far
allows); :class:`HSym` is a symbolic time the core can compute with, compare with
its infinities and use as a dict key; :func:`agree` says, as a z3 formula, that what
the code returned is what a model returned; :func:`explore` turns a scenario's runs
into a :class:`~proofs.loops.Check`. :func:`symbolic_math` is the one substitution a
run makes: the ``math`` that the core's modules see answers ``isnan``, ``isinf``,
``isfinite`` and ``nextafter`` on a symbolic real (and passes floats to :mod:`math`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import z3

from .loops import Check, Paths, Sym, _term

_CMP_INF = {  # x OP +inf for a finite x
    operator.lt: True,
    operator.le: True,
    operator.gt: False,
    operator.ge: False,
    operator.eq: False,
    operator.ne: True,
}
_MIRROR = {operator.lt: operator.gt, operator.le: operator.ge, operator.gt: operator.lt}
_MIRROR |= {operator.ge: operator.le, operator.eq: operator.eq, operator.ne: operator.ne}


class Raised:
    """What a run that raised returns in place of its result."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __str__(self) -> str:
        return f"raised {type(self.exc).__name__}: {self.exc}"


class Explorer(Paths):
    """Every feasible path through a function whose code branches on z3 terms: a
    branch is a choice only where both ways are satisfiable with the path so far."""

    def __init__(self, hyps: list[Any]) -> None:
        self.solver = z3.Solver()
        self.solver.add(*hyps)
        self.forced: list[bool] = []
        self.taken: list[bool] = []
        self.open: list[bool] = []  # the other way is feasible and not yet run
        self.conds: list[Any] = []

    def _sat(self, cond: Any) -> bool:
        self.solver.push()
        self.solver.add(cond)
        r = self.solver.check()
        self.solver.pop()
        return bool(r != z3.unsat)

    def decide(self, cond: Any) -> bool:
        i = len(self.taken)
        if i < len(self.forced):
            choice, other = self.forced[i], self.open[i]
        elif z3.is_true(cond) or z3.is_false(cond):  # no choice: no solver call
            choice, other = z3.is_true(cond), False
        else:
            yes = self._sat(cond)
            other = yes and self._sat(z3.Not(cond))
            choice = yes
        self.taken.append(choice)
        if i >= len(self.open):
            self.open.append(other)
        c = cond if choice else z3.Not(cond)
        self.conds.append(c)
        self.solver.push()
        self.solver.add(c)
        return choice

    def assume(self, cond: Any) -> None:
        """Adds ``cond`` to the path without a choice (what a fresh unknown is known
        to be: a run makes the same assumptions at the same points every time)."""
        self.conds.append(cond)
        self.solver.push()
        self.solver.add(cond)

    def runs(self, fn: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
        """``(path condition, fn's result)`` for every feasible path through ``fn``; a path
        on which ``fn`` raises yields :class:`Raised` as its result."""
        self.forced, self.open = [], []
        while True:
            self.taken, self.conds = [], []
            try:
                result = fn()
            except Exception as exc:  # the path ends here; the others are still run
                result = Raised(exc)
            finally:
                self.solver.pop(len(self.conds))
            yield z3.And(*self.conds), result
            taken, self.open = self.taken, self.open[: len(self.taken)]
            while taken and not (taken[-1] and self.open[-1]):
                taken.pop()
                self.open.pop()
            if not taken:
                return
            self.open[-1] = False
            self.forced = [*taken[:-1], False]


class HSym(Sym):
    """A :class:`Sym` that can be a dict key (every term hashes alike, so a lookup
    compares with ``==``: a branch) and is compared with the infinities the table
    starts its clock and tombstone at (a real term is finite)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return 0

    def __format__(self, spec: str) -> str:  # a message naming a symbolic value
        return str(self.t)

    def _op(self, other: Any, f: Callable[[Any, Any], Any], *, flip: bool = False) -> HSym:
        if isinstance(other, float) and math.isinf(other) and f in _CMP_INF:
            g = _MIRROR[f] if flip else f
            val = _CMP_INF[g] if other > 0 else not _CMP_INF[g]
            if g in (operator.eq, operator.ne):
                val = _CMP_INF[g]
            return HSym(z3.BoolVal(val), self.paths)
        if isinstance(other, float) and math.isnan(other):
            if f not in _CMP_INF:
                raise TypeError("arithmetic with NaN on a symbolic time")
            return HSym(z3.BoolVal(f is operator.ne), self.paths)  # NaN compares unequal
        if isinstance(other, bool):  # Python's: a bool is the int 0 or 1
            other = int(other)
        elif not isinstance(other, (int, float, Sym)) and not z3.is_expr(other):
            # what a float does with a str, None...: z3 would read "5" as a number
            if f in (operator.eq, operator.ne):
                return HSym(z3.BoolVal(f is operator.ne), self.paths)
            raise TypeError(f"a time and a {type(other).__name__}")
        a, b = self.t, _term(other)
        return HSym(f(b, a) if flip else f(a, b), self.paths)


def _plain(x: Any) -> bool:
    """A symbolic term, or a finite number or bool (what a term can be compared with)."""
    return isinstance(x, Sym) or (isinstance(x, (int, float)) and math.isfinite(x))


def _all(parts: Any) -> Any:
    """The conjunction of ``parts`` (each True, False or a z3 formula), as plain as it
    can be: True or False when no part is a formula (building z3 terms is the cost of
    a run)."""
    terms = []
    for part in parts:
        if part is False:
            return False
        if part is not True:
            terms.append(part)
    if not terms:
        return True
    return terms[0] if len(terms) == 1 else z3.And(*terms)


def agree(got: Any, want: Any) -> Any:
    """``got`` (the code's) is ``want`` (the model's): True, False, or a z3 formula
    when the answer depends on symbolic values."""
    if isinstance(got, Sym) or isinstance(want, Sym):
        if not (_plain(got) and _plain(want)):
            return False  # a term and None, an infinity or anything else
        a, b = _term(got), _term(want)
        if z3.is_expr(a) and z3.is_expr(b) and z3.eq(a, b):
            return True
        return a == b
    if is_dataclass(got) and not isinstance(got, type):
        if type(got) is not type(want):
            return False
        return _all(agree(getattr(got, f.name), getattr(want, f.name)) for f in fields(got))
    if isinstance(got, (list, tuple)):
        if not isinstance(want, (list, tuple)) or len(got) != len(want):
            return False
        return _all(agree(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(got, dict):
        if not isinstance(want, dict) or sorted(got) != sorted(want):
            return False
        return _all(agree(got[k], want[k]) for k in got)
    return bool(got == want)


#: stop building a system's checks at the first one plainly refuted (the mutation run's
#: proofs layer sets it: one failed obligation decides a mutant; ``prove`` builds all)
FAIL_FAST = False


def scenarios(
    label: str, only: str, todo: Sequence[tuple[str, Callable[[], Check]]]
) -> list[tuple[str, Check]]:
    """Each ``(name, build)`` of ``todo`` whose label (``label`` and the name) contains
    ``only``, built; under :data:`FAIL_FAST`, none after the first refuted one."""
    out = []
    for name, build in todo:
        if only in f"{label}{name}":
            chk = build()
            out.append((f"{label}{name}", chk))
            if FAIL_FAST and chk.refuted:
                break
    return out


def explore(
    check: Check, name: str, ex: Explorer, run: Callable[[list[tuple[str, Any]]], None]
) -> Check:
    """Adds to ``check`` a disjunct for every (path, label) where a pair (label,
    agreement) that ``run`` appends can fail. A path on which the code raises records
    the first such error in ``check.error`` (a crash); what the run compared before it
    raised still counts, and the other paths are still run. A path whose pair is
    plainly False refutes the check (every path the explorer runs is feasible): the
    paths after it are not run."""
    pairs: list[tuple[str, Any]] = []

    def attempt() -> None:
        pairs.clear()
        run(pairs)

    for pc, result in ex.runs(attempt):
        refuted = False
        for label, ok in pairs:
            if ok is not True and not (z3.is_expr(ok) and z3.is_true(ok)):
                bad = pc if ok is False else z3.And(pc, z3.Not(ok))
                check.bad.append((f"{name}, {label}", bad))
                refuted = refuted or ok is False
        if isinstance(result, Raised) and not check.error:
            check.error = f"{name}: {result}"[:300]
        if refuted:
            check.refuted = True
            break
    return check


numbers.Real.register(HSym)  # a symbolic time is a real number (naive models ask)


class SymMath:
    """:mod:`math` as the core sees it during a run: ``isnan``, ``isinf``, ``isfinite``
    and ``nextafter`` answer on a symbolic real; everything else, and every float,
    goes to :mod:`math` itself. A real is never NaN nor infinite; the float next to
    ``t`` is ``t`` plus or minus a fresh unknown that the path assumes positive, so
    no value lies between them that a rule could be asked at."""

    def __init__(self) -> None:
        self.used = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(math, name)

    def isnan(self, x: Any) -> bool:
        return False if isinstance(x, Sym) else math.isnan(x)

    def isinf(self, x: Any) -> bool:
        return False if isinstance(x, Sym) else math.isinf(x)

    def isfinite(self, x: Any) -> bool:
        return True if isinstance(x, Sym) else math.isfinite(x)

    def ceil(self, x: Any) -> Any:
        return HSym(-z3.ToInt(-x.t), x.paths) if isinstance(x, Sym) else math.ceil(x)

    def floor(self, x: Any) -> Any:
        return HSym(z3.ToInt(x.t), x.paths) if isinstance(x, Sym) else math.floor(x)

    def nextafter(self, x: Any, y: Any, /) -> Any:
        if not isinstance(x, Sym) and not isinstance(y, Sym):
            return math.nextafter(x, y)
        if isinstance(y, Sym) or not isinstance(x, Sym) or not math.isinf(y):
            raise TypeError("nextafter of a symbolic time, other than towards an infinity")
        eps = z3.Real(f"eps{self.used}")
        self.used += 1
        x.paths.assume(eps > 0)
        return HSym(x.t + eps if y > 0 else x.t - eps, x.paths)


@contextlib.contextmanager
def symbolic_math(shim: SymMath) -> Iterator[None]:
    """Every ``math`` (and every function taken from it by name) in the core's loaded
    modules is ``shim`` while the block runs."""
    saved = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("leaseproto.core.") or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            if val is math:
                new: Any = shim
            elif getattr(val, "__module__", None) == "math" and hasattr(SymMath, attr):
                new = getattr(shim, attr)
            else:
                continue
            saved.append((mod, attr, val))
            setattr(mod, attr, new)
    try:
        yield
    finally:
        for mod, attr, val in saved:
            setattr(mod, attr, val)
