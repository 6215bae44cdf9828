"""Fast runtime forms of the rules, generated from the rules themselves.

The hot loops (``LeaseTable.renew`` per heartbeat id, ``LeaseTable.expire`` per
due lease) would otherwise call a rule function per id, and the rule spends most
of its time in :mod:`.sym`'s helpers. Instead, each rule is *traced*: called once
on :class:`Node` values, whose operators record an expression tree and which
:mod:`.sym`'s helpers build through the same hook that builds z3 terms for the
proofs (``__sym_ops__``, in place of the z3 module). The tree is simplified
under the branch's assumption (a renewal that applies; a lease that is due),
subexpressions of the loop's invariants (``now``, ``extension``) are hoisted,
and the result is printed as inline Python into one loop template, compiled
once per rule object.

So the rule is still written once. ``tests/test_specialise.py`` has z3 prove
every generated expression equal to its rule, over reals and over IEEE doubles.
A rule that cannot be traced (one with Python control flow on its arguments, as
a test's patched rule may have) gets the same loop calling the rule per id.
Rebinding a rule in :mod:`.rules` (``monkeypatch.setattr``) is seen at the next
call: forms are cached per rule object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import rules as R

__all__ = ["Node", "Untraceable", "expire_form", "renew_form", "trace"]


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
        a, b = self, _lift(other)
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


def _lift(v: object) -> Node:
    if isinstance(v, Node):
        return v
    if isinstance(v, (bool, int, float)):
        return Node("const", (v,))
    raise Untraceable(f"cannot trace a {type(v).__name__}")


class _Ops:
    """What :mod:`.sym` calls in place of z3's ``If``/``And``/``Or``/``Not``."""

    @staticmethod
    def If(c: object, a: object, b: object) -> Node:  # noqa: N802 - z3's names
        return Node("if", (_lift(c), _lift(a), _lift(b)))

    @staticmethod
    def And(*cs: object) -> Node:  # noqa: N802
        return Node("and", tuple(_lift(c) for c in cs))

    @staticmethod
    def Or(*cs: object) -> Node:  # noqa: N802
        return Node("or", tuple(_lift(c) for c in cs))

    @staticmethod
    def Not(c: object) -> Node:  # noqa: N802
        return Node("not", (_lift(c),))


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
        return _lift(facts[n.key])
    if n.op in ("var", "const"):
        return n
    args = tuple(simplify(a, facts) for a in n.args)
    consts = [a.args[0] for a in args if a.op == "const"]
    if n.op in _BINOPS:
        if len(consts) == 2:
            return _lift(_BINOPS[n.op](consts[0], consts[1]))
        return Node(n.op, args)
    if n.op == "if":
        c, a, b = args
        if c.op == "const":
            return a if c.args[0] is True else b if c.args[0] is False else Node("if", args)
        return Node("if", args)
    if n.op == "not":
        return _lift(not consts[0]) if consts and isinstance(consts[0], bool) else Node("not", args)
    # and / or: conj/disj on bools (sym.conj returns ``a and b``, i.e. a bool here)
    absorbing = n.op == "or"
    keep = []
    for a in args:
        if a.op == "const" and isinstance(a.args[0], bool):
            if a.args[0] is absorbing:
                return _lift(absorbing)
            continue
        keep.append(a)
    if not keep:
        return _lift(not absorbing)
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


# -- the loops -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Form:
    """A compiled loop and, when the rule could be traced, the expressions it
    inlines (for the equivalence proofs): ``exprs`` name -> Python source,
    ``hoisted`` the loop-invariant names they use, ``assumes`` the source of
    the condition under which each expression but the first was simplified."""

    fn: Callable[..., Any]
    source: str
    traced: bool
    exprs: dict[str, str]
    hoisted: tuple[tuple[str, str], ...]


_RENEW = """\
def renew_loop(req_ids, get, ended_get, now, extension, lost, c, rule):
{hoisted}
    renewed = 0
    for rid in req_ids:
        lease = get(rid)
        if lease is None:
            ended = ended_get(rid)
            if ended is None:
                c["renew_unknown"] += 1
                continue
            c["renew_late"] += 1
            if lost is not None and ended[0] != {transferred}:
                lost.append(rid)
            continue
{body}
        if not applies:
            c["renew_lapsed"] += 1
            if lost is not None:
                lost.append(rid)
            continue
        lease.deadline = deadline
        lease.last_renewal = now
        renewed += 1
    return renewed
"""
_RENEW_CALL = """\
        applies, deadline = rule(lease.state, lease.deadline, lease.cap_at, now, extension)"""


def _compile(source: str, name: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(compile(source, f"<leaseproto.core.specialise {name}>", "exec"), scope)
    fn: Callable[..., Any] = scope[name]
    return fn


_cache: dict[tuple[object, ...], Form] = {}


def renew_form(rule: Callable[..., Any], *, capped: bool) -> Form:
    """The renew loop for ``rule`` (:func:`.rules.renew_rule` or a patched one);
    ``capped``: leases carry a ``cap_at`` (``max_lease_lifetime`` set)."""
    key = ("renew", rule, capped)
    form = _cache.get(key)
    if form is None:
        form = _cache[key] = _renew_form(rule, capped)
    return form


def _renew_form(rule: Callable[..., Any], capped: bool) -> Form:
    fill = {"transferred": repr(R.TRANSFERRED)}
    try:
        applies, deadline = trace(
            rule, "state", "deadline", "cap_at" if capped else None, "now", "extension"
        )
        applies, deadline = _lift(applies), _lift(deadline)
        applies = simplify(applies, {})
        deadline = simplify(deadline, assume(applies))
    except Untraceable:
        src = _RENEW.format(hoisted="    pass", body=_RENEW_CALL, **fill)
        return Form(_compile(src, "renew_loop"), src, False, {}, ())
    pr = Printer(frozenset({"now", "extension"}))
    a_src = pr.expr(applies)
    d_src = pr.expr(deadline)
    loads = "".join(
        f"        {v} = lease.{v}\n" for v in ("state", "deadline", "cap_at") if v in a_src + d_src
    )
    body = f"{loads}        applies = {a_src}\n        if applies:\n            deadline = {d_src}"
    hoisted = "\n".join(f"    {n} = {s}" for n, s in pr.hoisted) or "    pass"
    src = _RENEW.format(hoisted=hoisted, body=body, **fill)
    return Form(
        _compile(src, "renew_loop"),
        src,
        True,
        {"applies": a_src, "deadline": d_src},
        tuple(pr.hoisted),
    )


def expire_form(due_rule: Callable[..., Any], state_rule: Callable[..., Any]) -> Form:
    """``due(state, deadline, now)`` and, when it holds, the state the lease
    ends in, as one compiled function ``(state, deadline, now) -> int | None``
    (``None``: not due) for :meth:`LeaseTable.expire`."""
    key = ("expire", due_rule, state_rule)
    form = _cache.get(key)
    if form is None:
        form = _cache[key] = _expire_form(due_rule, state_rule)
    return form


_EXPIRE = """\
def expire_one(state, deadline, now, due_rule, state_rule):
{body}
"""


def _expire_form(due_rule: Callable[..., Any], state_rule: Callable[..., Any]) -> Form:
    try:
        due = simplify(_lift(trace(due_rule, "state", "deadline", "now")), {})
        end = simplify(_lift(trace(state_rule, "state", "deadline", "now")), assume(due))
    except Untraceable:
        body = (
            "    if due_rule(state, deadline, now):\n"
            "        return state_rule(state, deadline, now)\n"
            "    return None"
        )
        src = _EXPIRE.format(body=body)
        return Form(_compile(src, "expire_one"), src, False, {}, ())
    pr = Printer(frozenset({"now"}))
    d_src = pr.expr(due)
    e_src = pr.expr(end)
    if pr.hoisted:  # nothing to hoist out of one call: print them inline instead
        pr = Printer(frozenset())
        d_src, e_src = pr.expr(due), pr.expr(end)
    body = f"    if {d_src}:\n        return {e_src}\n    return None"
    src = _EXPIRE.format(body=body)
    return Form(_compile(src, "expire_one"), src, True, {"due": d_src, "state": e_src}, ())
