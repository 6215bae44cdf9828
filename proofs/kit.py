"""The small transition-system kit the models are written in (mypyvy style).

A :class:`System` has state fields (z3 sorts), parameters (constants shared
by the pre- and post-state: configuration values and timing bounds), axioms on
the parameters, an ``init`` predicate and named :class:`Transition` s. A
transition is *functional*: a guard over the pre-state and its arguments, and
an update giving the post-state value of each field it changes (every other
field keeps its value). Nondeterminism (a time step, a chosen ttl) enters
through the transition's arguments, which the proofs quantify over.

Being functional lets the same transition be used three ways: as a two-state
z3 relation (``relation``), evaluated on concrete values by the refinement
test (``step``), and unrolled by the counterexample search (``counterexamples``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import z3

Real = z3.RealSort()
Int = z3.IntSort()
Bool = z3.BoolSort()


class Values:
    """Values by field name with attribute access (``v.deadline``): what a
    transition's guard and update see, concrete or symbolic."""

    _v: dict[str, Any]

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__["_v"] = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_v"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._v[name]

    def names(self) -> list[str]:
        return list(self._v)

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._v.items()


class Vars(Values):
    """A namespace of fresh z3 constants, one per field; ``tag`` keeps the
    pre-state, post-state and steps apart."""

    def __init__(self, sorts: Mapping[str, Any], tag: str) -> None:
        super().__init__({name: z3.Const(f"{name}{tag}", sort) for name, sort in sorts.items()})


Guard = Callable[[Any, Any, Any], Any]
Update = Callable[[Any, Any, Any], dict[str, Any]]


@dataclass
class Transition:
    """``guard(s, a, p)`` and ``update(s, a, p) -> {field: value}``.

    ``witness(s, s2, a, p)``, when given, names the interesting outcome that the
    enabledness check must find reachable (so no proof passes vacuously).
    ``outputs(s, a, p) -> {name: value}`` names what the step emits (a release, a
    heartbeat sent), for step properties and for printing schedules.
    """

    name: str
    text: str
    args: dict[str, Any]
    guard: Guard
    update: Update
    witness: Callable[[Any, Any, Any, Any], Any] | None = None
    outputs: Callable[[Any, Any, Any], dict[str, Any]] | None = None


@dataclass
class System:
    name: str
    text: str
    fields: dict[str, Any]
    params: dict[str, Any]
    axioms: Callable[[Any], Any]
    init: Callable[[Any, Any], Any]
    transitions: list[Transition] = field(default_factory=list)

    def state(self, tag: str) -> Vars:
        return Vars(self.fields, f"@{tag}")

    def param_vars(self) -> Vars:
        return Vars(self.params, "")

    def args(self, t: Transition, tag: str) -> Vars:
        return Vars(t.args, f"@{t.name}.{tag}")

    def transition(self, name: str) -> Transition:
        for t in self.transitions:
            if t.name == name:
                return t
        raise KeyError(name)

    def relation(self, t: Transition, s: Any, s2: Any, a: Any, p: Any) -> Any:
        """The two-state formula: guard, updated fields, all others unchanged."""
        upd = t.update(s, a, p)
        unknown = set(upd) - set(self.fields)
        if unknown:
            raise KeyError(f"{self.name}.{t.name} updates unknown fields {sorted(unknown)}")
        frame = [s2[f] == (upd[f] if f in upd else s[f]) for f in self.fields]
        return z3.And(t.guard(s, a, p), *frame)


# -- concrete values ----------------------------------------------------------------------
def to_z3(value: Any, sort: Any) -> Any:
    """A Python value as a z3 constant of ``sort`` (floats exactly, as rationals)."""
    if z3.is_expr(value):
        return value
    if sort == Bool:
        return z3.BoolVal(bool(value))
    if sort == Int:
        return z3.IntVal(int(value))
    frac = Fraction(value)
    return z3.RealVal(f"{frac.numerator}/{frac.denominator}")


def from_z3(expr: Any) -> Any:
    """A simplified z3 constant as bool, int or Fraction."""
    e = z3.simplify(expr)
    if z3.is_true(e):
        return True
    if z3.is_false(e):
        return False
    if z3.is_int_value(e):
        return e.as_long()
    if z3.is_rational_value(e):
        return Fraction(e.numerator_as_long(), e.denominator_as_long())
    if z3.is_algebraic_value(e):
        return Fraction(e.approx(12).as_fraction())
    raise ValueError(f"not a constant: {e}")


def model_value(m: Any, expr: Any) -> Any:
    return from_z3(m.eval(expr, model_completion=True))


def fmt(value: Any) -> str:
    """A readable rendering of a model value."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        return f"{float(value):.6g}"
    return str(value)
