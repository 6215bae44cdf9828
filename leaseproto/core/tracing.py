"""Tracing a rule into an expression tree, simplifying and printing it as Python.

A rule (:mod:`.rules`) is called once on :class:`Node` values, whose operators
record an expression tree; :mod:`.sym`'s helpers build their ``If``/``And``/
``Or``/``Not`` through the same hook that builds z3 terms for the proofs
(``__sym_ops__``, in place of the z3 module). :func:`simplify` folds the tree
under known facts and :class:`Printer` prints it as inline Python for
:mod:`.specialise`'s loops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Node", "Printer", "Untraceable", "assume", "lift", "simplify", "trace"]


class Untraceable(Exception):
    """The rule did something a trace cannot follow (``bool()`` of a symbolic value)."""


_BINOPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class Node:
    """A traced value: ``op`` is ``"var"`` (``args = (name,)``), ``"const"``
    (``args = (value,)``), a binary operator of :data:`_BINOPS`, or ``"if"``,
    ``"and"``, ``"or"``, ``"not"``."""

    __slots__ = ("args", "key", "op")
    __hash__ = None  # type: ignore[assignment]  # == builds a node

    def __init__(self, op: str, args: tuple[Any, ...]) -> None:
        self.op = op
        self.args = args
        self.key: tuple[Any, ...] = (
            (op, *args) if op in ("var", "const") else (op, *(a.key for a in args))
        )

    def __bool__(self) -> bool:
        raise Untraceable("a rule branched on a traced value")

    def _bin(self, op: str, other: object, *, flip: bool = False) -> Node:
        a, b = self, lift(other)
        return Node(op, (b, a) if flip else (a, b))

    def __add__(self, o: object) -> Node:
        return self._bin("+", o)

    def __radd__(self, o: object) -> Node:
        return self._bin("+", o, flip=True)

    def __sub__(self, o: object) -> Node:
        return self._bin("-", o)

    def __rsub__(self, o: object) -> Node:
        return self._bin("-", o, flip=True)

    def __mul__(self, o: object) -> Node:
        return self._bin("*", o)

    def __rmul__(self, o: object) -> Node:
        return self._bin("*", o, flip=True)

    def __truediv__(self, o: object) -> Node:
        return self._bin("/", o)

    def __rtruediv__(self, o: object) -> Node:
        return self._bin("/", o, flip=True)

    def __lt__(self, o: object) -> Node:
        return self._bin("<", o)

    def __le__(self, o: object) -> Node:
        return self._bin("<=", o)

    def __gt__(self, o: object) -> Node:
        return self._bin(">", o)

    def __ge__(self, o: object) -> Node:
        return self._bin(">=", o)

    def __eq__(self, o: object) -> Node:  # type: ignore[override]
        return self._bin("==", o)

    def __ne__(self, o: object) -> Node:  # type: ignore[override]
        return self._bin("!=", o)


def lift(v: object) -> Node:
    if isinstance(v, Node):
        return v
    if isinstance(v, (bool, int, float)):
        return Node("const", (v,))
    raise Untraceable(f"cannot trace a {type(v).__name__}")


class _Ops:
    """What :mod:`.sym` calls in place of z3's ``If``/``And``/``Or``/``Not``."""

    @staticmethod
    def If(c: object, a: object, b: object) -> Node:  # noqa: N802 - z3's names
        return Node("if", (lift(c), lift(a), lift(b)))

    @staticmethod
    def And(*cs: object) -> Node:  # noqa: N802
        return Node("and", tuple(lift(c) for c in cs))

    @staticmethod
    def Or(*cs: object) -> Node:  # noqa: N802
        return Node("or", tuple(lift(c) for c in cs))

    @staticmethod
    def Not(c: object) -> Node:  # noqa: N802
        return Node("not", (lift(c),))


Node.__sym_ops__ = _Ops  # type: ignore[attr-defined]


def trace(rule: Callable[..., Any], *args: object) -> Any:
    """Call ``rule`` with ``args``, where each ``str`` names a variable (a
    :class:`Node`) and anything else is passed as is. Raises
    :class:`Untraceable`."""
    try:
        return rule(*(Node("var", (a,)) if isinstance(a, str) else a for a in args))
    except Untraceable:
        raise
    except Exception as exc:  # anything else a rule does on a traced value
        raise Untraceable(f"{type(exc).__name__}: {exc}") from exc


# -- simplification ------------------------------------------------------------------------
def simplify(n: Node, facts: dict[tuple[Any, ...], object]) -> Node:
    """``n`` with every subterm in ``facts`` (by key) replaced by its value and
    constants folded with Python's own operators (so the float results are the
    ones the rule computes)."""
    if n.key in facts:
        return lift(facts[n.key])
    if n.op in ("var", "const"):
        return n
    args = tuple(simplify(a, facts) for a in n.args)
    consts = [a.args[0] for a in args if a.op == "const"]
    if n.op in _BINOPS:
        if len(consts) == 2:
            return lift(_BINOPS[n.op](consts[0], consts[1]))
        return Node(n.op, args)
    if n.op == "if":
        c, a, b = args
        if c.op == "const":
            return a if c.args[0] is True else b if c.args[0] is False else Node("if", args)
        return Node("if", args)
    if n.op == "not":
        return lift(not consts[0]) if consts and isinstance(consts[0], bool) else Node("not", args)
    # and / or: conj/disj on bools (sym.conj returns ``a and b``, i.e. a bool here)
    absorbing = n.op == "or"
    keep = []
    for a in args:
        if a.op == "const" and isinstance(a.args[0], bool):
            if a.args[0] is absorbing:
                return lift(absorbing)
            continue
        keep.append(a)
    if not keep:
        return lift(not absorbing)
    return keep[0] if len(keep) == 1 else Node(n.op, tuple(keep))


def assume(cond: Node) -> dict[tuple[Any, ...], object]:
    """Facts that hold when ``cond`` is true: the condition and each conjunct,
    and ``x == k`` for a conjunct naming a variable equal to a constant (so
    other comparisons of ``x`` with constants fold)."""
    facts: dict[tuple[Any, ...], object] = {cond.key: True}
    conjuncts = cond.args if cond.op == "and" else (cond,)
    for c in conjuncts:
        facts[c.key] = True
        if c.op == "==":
            a, b = c.args
            if a.op == "var" and b.op == "const":
                facts[a.key] = b.args[0]
    return facts


# -- printing ------------------------------------------------------------------------------
_PREC = {"if": 0, "or": 1, "and": 2, "not": 3, "cmp": 4, "+": 5, "-": 5, "*": 6, "/": 6}


def _prec(n: Node) -> int:
    if n.op in ("<", "<=", ">", ">=", "==", "!="):
        return _PREC["cmp"]
    return _PREC.get(n.op, 9)


class Printer:
    """Python source for nodes; ``hoist`` names subterms computed before the loop."""

    def __init__(self, invariant: frozenset[str]) -> None:
        self.invariant = invariant
        self.hoisted: list[tuple[str, str]] = []
        self._names: dict[tuple[Any, ...], str] = {}

    def _free(self, n: Node) -> set[str]:
        if n.op == "var":
            return {n.args[0]}
        if n.op == "const":
            return set()
        out: set[str] = set()
        for a in n.args:
            out |= self._free(a)
        return out

    def expr(self, n: Node, *, top: bool = True) -> str:
        if n.op == "var":
            return str(n.args[0])
        if n.op == "const":
            return repr(n.args[0])
        if n.key in self._names:
            return self._names[n.key]
        if not top and self._free(n) <= self.invariant:
            src = self.expr(n, top=True)
            name = f"_h{len(self.hoisted)}"
            self.hoisted.append((name, src))
            self._names[n.key] = name
            return name
        p = _prec(n)

        def sub(a: Node, tight: bool = False) -> str:
            s = self.expr(a, top=False)
            q = _prec(a)
            return f"({s})" if q < p or (tight and q == p) else s

        if n.op == "if":
            c, a, b = n.args
            return f"{sub(a, True)} if {sub(c, True)} else {sub(b)}"
        if n.op == "not":
            return f"not {sub(n.args[0])}"
        if n.op in ("and", "or"):
            return f" {n.op} ".join(sub(a, True) for a in n.args)
        a, b = n.args
        cmp = p == _PREC["cmp"]  # never print a chained comparison
        return f"{sub(a, cmp)} {n.op} {sub(b, True)}"
