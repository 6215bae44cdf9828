"""The handful of operators the transition rules are written in.

Every rule in :mod:`leaseproto.core.rules` is written with these helpers instead of
``max``/``min``/``if``, so the *same function* runs on floats in the runtime and
on z3 terms in ``proofs/`` (spec §9). On Python values each helper is the
builtin; on anything else (a z3 expression) it builds the z3 term. z3 is
imported lazily, only when a symbolic value is seen, so the runtime never
needs it.
"""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

__all__ = ["conj", "disj", "ite", "neg", "vmax", "vmin"]

T = TypeVar("T")

_z3: Any = None


def _z3mod() -> Any:
    global _z3  # noqa: PLW0603 - lazily bound module handle
    if _z3 is None:
        _z3 = importlib.import_module("z3")
    return _z3


def ite(cond: bool, then: T, other: T) -> T:
    """``then if cond else other``; a z3 ``If`` when ``cond`` is symbolic."""
    if cond is True:
        return then
    if cond is False:
        return other
    result: T = _z3mod().If(cond, then, other)
    return result


def vmax(a: T, b: T) -> T:
    """The larger of ``a`` and ``b`` (``a`` on a tie)."""
    c = a >= b  # type: ignore[operator]
    if c is True:
        return a
    if c is False:
        return b
    result: T = _z3mod().If(c, a, b)
    return result


def vmin(a: T, b: T) -> T:
    """The smaller of ``a`` and ``b`` (``a`` on a tie)."""
    c = a <= b  # type: ignore[operator]
    if c is True:
        return a
    if c is False:
        return b
    result: T = _z3mod().If(c, a, b)
    return result


# conj/disj/neg are on the runtime's hot path: explicit loops, no helper calls.
def conj(*conds: bool) -> bool:
    """Logical and of every condition."""
    if len(conds) == 2:  # the rules' common case
        a, b = conds
        if (a is True or a is False) and (b is True or b is False):
            return a and b
    for c in conds:
        if c is not True and c is not False:
            result: bool = _z3mod().And(*conds)
            return result
    return False not in conds


def disj(*conds: bool) -> bool:
    """Logical or of every condition."""
    for c in conds:
        if c is not True and c is not False:
            result: bool = _z3mod().Or(*conds)
            return result
    return True in conds


def neg(cond: bool) -> bool:
    """Logical not."""
    if cond is True or cond is False:
        return not cond
    result: bool = _z3mod().Not(cond)
    return result
