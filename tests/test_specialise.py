"""The runtime's generated forms of the rules (leaseproto.core.specialise) equal the rules.

z3 proves each generated expression equal to the rule it was traced from, over reals and
over bit-exact IEEE doubles (``==`` on z3 floating-point terms is identity of the value:
``-0.0`` differs from ``0.0``); random inputs then check the compiled loops, and a rule
that cannot be traced, or is rebound, still decides what runs.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import operator
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaseproto import LeaseConfig, LeaseTable
from leaseproto.core import rules as R
from leaseproto.core import specialise as S
from leaseproto.core.events import Release, ReleaseReason, make_release
from leaseproto.core.state import Input
from leaseproto.core.sym import conj, disj, neg
from leaseproto.testing import NaiveLeaseTable

z3 = pytest.importorskip("z3")


def _z3_eval(src: str, env: dict[str, Any]) -> Any:
    """Evaluate a generated Python expression on z3 terms."""

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Name):
            return env[n.id]
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            ops: dict[type, Callable[[Any, Any], Any]] = {
                ast.Add: lambda x, y: x + y,
                ast.Sub: lambda x, y: x - y,
                ast.Mult: lambda x, y: x * y,
                ast.Div: lambda x, y: x / y,
            }
            return ops[type(n.op)](a, b)
        if isinstance(n, ast.Compare):
            assert len(n.ops) == 1, "a generated comparison is never chained"
            a, b = ev(n.left), ev(n.comparators[0])
            cmp: dict[type, Callable[[Any, Any], Any]] = {
                ast.Lt: lambda x, y: x < y,
                ast.LtE: lambda x, y: x <= y,
                ast.Gt: lambda x, y: x > y,
                ast.GtE: lambda x, y: x >= y,
                ast.Eq: lambda x, y: x == y,
                ast.NotEq: lambda x, y: x != y,
            }
            return cmp[type(n.ops[0])](a, b)
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]
            return z3.And(*vals) if isinstance(n.op, ast.And) else z3.Or(*vals)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return z3.Not(ev(n.operand))
        if isinstance(n, ast.IfExp):
            return z3.If(ev(n.test), ev(n.body), ev(n.orelse))
        raise AssertionError(f"unexpected syntax in a generated form: {ast.dump(n)}")

    return ev(ast.parse(src, mode="eval").body)


def _numbers(kind: str, names: list[str]) -> dict[str, Any]:
    if kind == "real":
        return {n: z3.Real(n) for n in names}
    return {n: z3.FP(n, z3.Float64()) for n in names}


def _prove(claim: Any) -> None:
    s = z3.Solver()
    s.set(timeout=60_000)
    s.add(z3.Not(claim))
    result = s.check()
    assert result == z3.unsat, f"{result}: {s.model() if result == z3.sat else ''}"


@pytest.fixture(autouse=True)
def _fresh_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds its forms afresh: ``renew_form``/``expire_form`` cache a form
    per rule for the process, so without this a test would check the form an earlier
    test traced (and, in the mutation run's baseline, trace no line of the tracer)."""
    monkeypatch.setattr(S, "_cache", {})


def _env(form: S.Form, env: dict[str, Any]) -> dict[str, Any]:
    for name, src in form.hoisted:
        env[name] = _z3_eval(src, env)
    return env


@pytest.mark.parametrize("kind", ["real", "ieee"])
@pytest.mark.parametrize("capped", [False, True])
def test_generated_renewal_equals_renew_rule(kind: str, capped: bool) -> None:
    form = S.renew_form(R.renew_rule, capped=capped)
    assert form.traced
    env = _numbers(kind, ["deadline", "cap_at", "now", "extension"])
    env["state"] = z3.Int("state")
    applies, deadline = R.renew_rule(
        env["state"],
        env["deadline"],
        env["cap_at"] if capped else None,
        env["now"],
        env["extension"],
    )
    env = _env(form, env)
    gen_applies = _z3_eval(form.exprs["applies"], env)
    gen_deadline = _z3_eval(form.exprs["deadline"], env)
    # the loop renews only leases of the live map, which are GRANTED (S.LIVE; the table's
    # invariant, checked in tests/test_hot_paths.py): equal to the rule on every such lease
    live = env["state"] == R.GRANTED
    assert S.LIVE == {("var", "state"): R.GRANTED}
    _prove(z3.Implies(live, gen_applies == applies))
    # the loop stores the deadline only when the renewal applies (it is unchanged otherwise)
    _prove(z3.Implies(z3.And(live, applies), gen_deadline == deadline))
    _prove(z3.Implies(z3.Not(applies), deadline == env["deadline"]))


@pytest.mark.parametrize("kind", ["real", "ieee"])
def test_generated_expiry_equals_expire_rules(kind: str) -> None:
    form = S.expire_form(R.expire_due, R.expire_state)
    assert form.traced
    env = _numbers(kind, ["deadline", "now"])
    env["state"] = z3.Int("state")
    due = R.expire_due(env["state"], env["deadline"], env["now"])
    end = R.expire_state(env["state"], env["deadline"], env["now"])
    _prove(_z3_eval(form.exprs["due"], env) == due)
    _prove(z3.Implies(due, _z3_eval(form.exprs["state"], env) == end))


# -- the compiled loops on random inputs ---------------------------------------------------
_floats = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 5.0, 20.0, 30.0, 1e-300, 1e300, math.inf, -math.inf]),
    st.floats(allow_nan=False, min_value=-1e6, max_value=1e6),
)


class _L:
    __slots__ = ("cap_at", "deadline", "last_renewal", "req_id", "state")

    def __init__(self, rid: str, state: int, deadline: float, cap_at: float | None) -> None:
        self.state, self.deadline, self.cap_at, self.last_renewal = state, deadline, cap_at, None
        self.req_id = rid


@settings(max_examples=400)
@given(
    st.lists(st.tuples(st.just(R.GRANTED), _floats, _floats), min_size=1, max_size=8),
    _floats,
    _floats,
    st.booleans(),
)
def test_compiled_renew_loop_matches_calling_the_rule(
    leases: list[tuple[int, float, float]], now: float, ext: float, capped: bool
) -> None:
    fast = S.renew_form(R.renew_rule, capped=capped)
    calls = S._compile(S._renew_source("    pass", S._RENEW_CALL), "renew_loop")
    assert fast.traced
    for unknown in ([], ["unknown"]):  # the loop over leases only, and the one over ids
        a = {
            f"r{i}": _L(f"r{i}", s, d, c if capped else None) for i, (s, d, c) in enumerate(leases)
        }
        b = {k: _L(k, v.state, v.deadline, v.cap_at) for k, v in a.items()}
        ca: dict[str, int] = {"renew_unknown": 0, "renew_late": 0, "renew_lapsed": 0}
        cb = dict(ca)
        ids = [*a, *unknown]
        fa, fb = [a.get(i) for i in ids], [b.get(i) for i in ids]
        la: list[str] = []
        lb: list[str] = []
        na = fast.fn(ids, fa, all(fa), {}, now, ext, la, ca, R.renew_rule)
        nb = calls(ids, fb, all(fb), {}, now, ext, lb, cb, R.renew_rule)
        assert (na, la, ca) == (nb, lb, cb)
        for k, la_ in a.items():
            assert math.copysign(1, la_.deadline) == math.copysign(1, b[k].deadline)
            assert la_.last_renewal == b[k].last_renewal
            # now=-inf, extension=inf: both store NaN (distinct objects, so not ==)
            x, y = la_.deadline, b[k].deadline
            assert x == y or (math.isnan(x) and math.isnan(y))


def _assign_with_python_control_flow(
    state: int, deadline: float, cap_at: float | None, now: float, extension: float
) -> tuple[bool, float]:
    applies = state == R.GRANTED and now < deadline
    return applies, (now + extension if applies else deadline)


def test_an_untraceable_rule_is_called_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    form = S.renew_form(_assign_with_python_control_flow, capped=False)
    assert not form.traced and "rule(" in form.source
    t = LeaseTable(LeaseConfig())
    t.grant("a", now=0.0)
    t.renew(["a"], now=1.0)
    assert t.deadline("a") == 30.0  # max(30, 21)
    monkeypatch.setattr(R, "renew_rule", _assign_with_python_control_flow)
    t.renew(["a"], now=2.0)
    assert t.deadline("a") == 22.0  # the patched rule ran, through the fallback loop
    monkeypatch.undo()
    t.renew(["a"], now=3.0)
    assert t.deadline("a") == 23.0  # the real rule again: max(22, 23)


def test_the_deadline_queue_follows_a_rule_that_moves_a_deadline_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the assigning rule renews l30 to 21, below the 30 it is queued at: next_deadline
    # queues it again at 21 and takes the emptied 30 out of the middle of the heap of
    # deadlines (queued in this order, so the heap is no longer in order without 30
    # until it is heapified again)
    t = LeaseTable(LeaseConfig())
    ttls = (30, 40, 60, 70, 50, 80, 90)
    for ttl in ttls:
        t.grant(f"l{ttl}", now=0.0, ttl=float(ttl))
    monkeypatch.setattr(R, "renew_rule", _assign_with_python_control_flow)
    t.renew(["l30"], now=1.0)
    assert t.deadline("l30") == 21.0
    assert t.next_deadline() == 21.0
    assert [r.req_id for r in t.expire(now=21.0)] == ["l30"]
    assert t.next_deadline() == 40.0
    got = [(r.req_id, r.deadline) for r in t.expire(now=100.0)]
    assert got == [(f"l{ttl}", float(ttl)) for ttl in sorted(ttls[1:])]
    assert t.next_deadline() is None


def test_expire_takes_the_leases_one_by_one_when_a_rebound_rule_spares_some(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a due rule with 5 s of grace: among the leases the queue finds due at 42, a (30) and
    # c (36) are, b (40) is not yet: expire ends a and c and queues b again
    def due_with_grace(state: Any, deadline: Any, now: Any) -> Any:
        return R.conj(state == R.GRANTED, deadline + 5.0 <= now)

    t = LeaseTable(LeaseConfig(tombstone_capacity=1))
    t.grant("a", now=0.0)
    t.grant("b", now=0.0, ttl=40.0)
    t.grant("c", now=0.0, ttl=36.0)
    monkeypatch.setattr(R, "expire_due", due_with_grace)
    got = [(r.req_id, r.reason) for r in t.expire(now=42.0)]
    assert got == [("a", ReleaseReason.EXPIRED), ("c", ReleaseReason.EXPIRED)]
    assert t.stats.released_expired == 2 and t.live() == ["b"] and t.next_deadline() == 40.0
    assert t.ended("c") is ReleaseReason.EXPIRED and t.ended("a") is None  # capacity 1
    assert t.expire(now=44.0) == []
    assert [r.req_id for r in t.expire(now=45.0)] == ["b"]
    assert t.stats.released_expired == 3


def test_expire_runs_a_rebound_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    def ends_aborted(state: Any, deadline: Any, now: Any) -> Any:
        return R.next_state(state, Input.RECV_ABORT, R.expire_due(state, deadline, now))

    t = LeaseTable(LeaseConfig())
    t.grant("a", now=0.0)
    t.grant("b", now=0.0)
    assert [r.reason for r in t.expire(now=30.0)] == [ReleaseReason.EXPIRED] * 2
    t.grant("a", now=30.0)
    monkeypatch.setattr(R, "expire_state", ends_aborted)
    assert S.expire_form(R.expire_due, ends_aborted).exprs["state"] == "4"
    assert [(r.req_id, r.reason) for r in t.expire(now=60.0)] == [("a", ReleaseReason.ABORTED)]
    assert t.stats.released_aborted == 1


@given(
    st.text(min_size=1, max_size=8),
    st.sampled_from(list(ReleaseReason)),
    _floats,
    _floats,
    _floats,
    st.one_of(st.none(), _floats),
)
def test_make_release_equals_the_constructor(  # noqa: PLR0917
    rid: str, reason: ReleaseReason, at: float, granted: float, deadline: float, last: float | None
) -> None:
    assert tuple(f.name for f in dataclasses.fields(Release)) == (
        "req_id",
        "reason",
        "at",
        "granted_at",
        "deadline",
        "last_renewal",
    )
    fast = make_release(rid, reason, at, granted, deadline, last)
    slow = Release(rid, reason, at, granted_at=granted, deadline=deadline, last_renewal=last)
    assert fast == slow
    assert type(fast) is Release
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.at = 0.0  # type: ignore[misc]


def test_make_releases_equals_make_release_per_lease_and_none_for_no_lease() -> None:
    from leaseproto.core.events import make_releases

    leases = [
        SimpleNamespace(req_id="a", granted_at=1.0, deadline=5.0, last_renewal=None),
        SimpleNamespace(req_id="b", granted_at=2.0, deadline=7.0, last_renewal=3.0),
    ]
    got = make_releases(leases, ReleaseReason.EXPIRED, 8.0)
    assert got == [
        make_release("a", ReleaseReason.EXPIRED, 8.0, 1.0, 5.0, None),
        make_release("b", ReleaseReason.EXPIRED, 8.0, 2.0, 7.0, 3.0),
    ]
    assert make_releases([], ReleaseReason.EXPIRED, 8.0) == []


def test_a_burst_of_expiries_matches_one_by_one_and_shares_tombstones() -> None:
    cfg = LeaseConfig(tombstone_capacity=5)
    batch, single = LeaseTable(cfg), LeaseTable(cfg)
    for t in (batch, single):
        for i in sorted(range(12), key=lambda i: i % 3):
            t.grant(f"r{i}", now=float(i % 3))
        t.renew(["r0", "r4"], now=12.0)  # deadlines 30 and 31 -> 32
    out = batch.expire(now=40.0)
    one_by_one = [r for k in range(12, 41) for r in single.expire(now=float(k))]
    assert sorted(out, key=lambda r: r.req_id) == sorted(
        [dataclasses.replace(r, at=40.0) for r in one_by_one], key=lambda r: r.req_id
    )
    # earliest deadline first, ties in grant order (spec, issue 11's expire-order bug): the
    # renewed r0 and r4 (deadline 32) go after every lease due at 30 and 31, as the naive
    # model releases them
    assert [r.req_id for r in out] == [f"r{i}" for i in (3, 6, 9, 1, 7, 10, 0, 4, 2, 5, 8, 11)]
    naive = NaiveLeaseTable(cfg)
    for i in sorted(range(12), key=lambda i: i % 3):
        naive.grant(f"r{i}", now=float(i % 3))
    naive.renew(["r0", "r4"], now=12.0)
    assert [r.req_id for r in naive.expire(now=40.0)] == [r.req_id for r in out]
    assert batch.stats == single.stats
    kept = [rid for rid in (f"r{i}" for i in range(12)) if batch.ended(rid) is not None]
    assert kept == ["r2", "r4", "r5", "r8", "r11"]  # capacity 5: the last five ended
    assert len({id(batch._ended[k]) for k in kept}) == 1  # one tombstone value per call


def test_the_printer_parenthesises_by_precedence() -> None:
    """Every nesting of and/or/not/if the printer writes evaluates as the tree does
    (the rules in use today never nest ``or`` inside ``and``)."""

    from leaseproto.core.specialise import Node, Printer

    a, b, c = (Node("var", (x,)) for x in "abc")
    trees = {
        "(a or b) and c": Node("and", (Node("or", (a, b)), c)),
        "a and (b or c)": Node("and", (a, Node("or", (b, c)))),
        "not (a or b)": Node("not", (Node("or", (a, b)),)),
        "(a if b else c) or a": Node("or", (Node("if", (b, a, c)), a)),
    }
    for want, tree in trees.items():
        src = Printer(frozenset()).expr(tree)
        for va, vb, vc in itertools.product([False, True], repeat=3):
            env = {"a": va, "b": vb, "c": vc}
            assert eval(src, {}, env) == eval(want, {}, env), (want, src)


def test_simplify_folds_a_rule_with_every_variable_known_to_the_rule_s_own_value() -> None:
    """Constants fold with Python's own operators: the tree of a rule, every
    variable given, folds to exactly what the rule returns on those floats."""
    from leaseproto.core.tracing import simplify, trace

    cases: list[tuple[Callable[..., Any], dict[str, float]]] = [
        (R.aged_uncertainty, {"uncertainty": 0.004, "age": 30.0, "rho": 1e-4}),
        (R.aged_uncertainty, {"uncertainty": 0.0, "age": 1.5, "rho": 0.25}),
        (R.read_allowed, {"d": 10.0, "now": 7.0, "off": 0.5, "u": 0.25, "m": 2.0}),
        (R.read_allowed, {"d": 10.0, "now": 7.5, "off": 0.5, "u": 0.25, "m": 2.0}),
        (R.heartbeat_due, {"last": 1.0, "now": 3.0, "interval": 2.0}),
        (R.heartbeat_due, {"last": 1.0, "now": 2.5, "interval": 2.0}),
        (R.expire_due, {"state": R.GRANTED, "deadline": 5.0, "now": 5.0}),
        (R.expire_due, {"state": R.GRANTED, "deadline": 5.0, "now": 4.0}),
        (R.expire_due, {"state": R.EXPIRED, "deadline": 5.0, "now": 6.0}),
    ]
    # and each operator a trace records, on a pair below, equal and above
    cases += [
        (op, {"a": a, "b": b})
        for op in (
            operator.add,
            operator.sub,
            operator.mul,
            operator.truediv,
            operator.lt,
            operator.le,
            operator.gt,
            operator.ge,
            operator.eq,
            operator.ne,
        )
        for a, b in ((2.0, 3.0), (3.0, 3.0), (5.0, 3.0))
    ]
    for rule, values in cases:
        tree = trace(rule, *values)
        folded = simplify(tree, {("var", k): v for k, v in values.items()})
        assert folded.op == "const", (rule.__name__, values)
        assert folded.args[0] == rule(*values.values()), (rule.__name__, values)


def _parsed_back(n: ast.AST) -> tuple[Any, ...]:
    """The tree key of a printed expression, read back from Python's own parse."""
    binops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
    cmps = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
    if isinstance(n, ast.Name):
        return ("var", n.id)
    if isinstance(n, ast.BinOp):
        return (binops[type(n.op)], _parsed_back(n.left), _parsed_back(n.right))
    if isinstance(n, ast.Compare):
        assert len(n.ops) == 1, "a printed comparison is never chained"
        return (cmps[type(n.ops[0])], _parsed_back(n.left), _parsed_back(n.comparators[0]))
    if isinstance(n, ast.BoolOp):
        return ("and" if isinstance(n.op, ast.And) else "or", *map(_parsed_back, n.values))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
        return ("not", _parsed_back(n.operand))
    assert isinstance(n, ast.IfExp), ast.dump(n)
    return ("if", _parsed_back(n.test), _parsed_back(n.body), _parsed_back(n.orelse))


def test_the_printer_s_source_parses_back_to_the_tree_for_every_nesting() -> None:
    """Every operator inside every operand of every operator (``a - (b + c)``,
    ``(a + b) * c``, ``not (a and b)``, ``a if (b if c else d) else e`` ...): Python
    parses the printed source back to the very tree, so it computes what the tree does."""
    from leaseproto.core.tracing import Node, Printer

    arity = {op: 2 for op in ["+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!=", "and", "or"]}
    arity |= {"not": 1, "if": 3}
    names = iter(itertools.cycle("abcdefg"))

    def leaves(k: int) -> tuple[Node, ...]:
        return tuple(Node("var", (next(names),)) for _ in range(k))

    for outer, inner in itertools.product(arity, arity):
        for pos in range(arity[outer]):
            args = list(leaves(arity[outer]))
            args[pos] = Node(inner, leaves(arity[inner]))
            tree = Node(outer, tuple(args))
            src = Printer(frozenset()).expr(tree)
            assert _parsed_back(ast.parse(src, mode="eval").body) == tree.key, (outer, inner, src)


def test_assume_gives_a_variable_a_value_only_from_an_equality_with_a_constant() -> None:
    from leaseproto.core.tracing import assume, simplify, trace

    x_plus_one = trace(lambda x: x + 1, "x")
    # under x == 1, x + 1 folds to 2
    assert simplify(x_plus_one, assume(trace(lambda x: x == 1, "x"))).key == ("const", 2)
    # under x < 1 and y < 2, each conjunct is known true
    both = assume(trace(lambda x, y: conj(x < 1, y < 2), "x", "y"))
    assert simplify(trace(lambda x: x < 1, "x"), both).key == ("const", True)
    assert simplify(trace(lambda y: neg(y < 2), "y"), both).key == ("const", False)
    # x == y and x == y + 1 give x no constant: x + 1 is left as it is
    for cond in (trace(lambda x, y: x == y, "x", "y"), trace(lambda x, y: x == y + 1, "x", "y")):
        assert simplify(x_plus_one, assume(cond)).key == x_plus_one.key


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_CMP = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def test_trace_records_a_constant_on_either_side_of_each_operator() -> None:
    """``2 op x`` and ``x op 2``: an arithmetic node keeps its operands in order, and
    every node folds, ``x`` given, to what Python computes."""
    from leaseproto.core.tracing import simplify, trace

    for name, op in {**_ARITH, **_CMP}.items():
        left = trace(lambda x, op=op: op(2.0, x), "x")
        right = trace(lambda x, op=op: op(x, 2.0), "x")
        if name in _ARITH:
            assert left.key == (name, ("const", 2.0), ("var", "x"))
            assert right.key == (name, ("var", "x"), ("const", 2.0))
        for x in (1.0, 2.0, 5.0):
            assert simplify(left, {("var", "x"): x}).key == ("const", op(2.0, x)), (name, x)
            assert simplify(right, {("var", "x"): x}).key == ("const", op(x, 2.0)), (name, x)


def test_a_traced_value_refuses_what_a_trace_cannot_follow() -> None:
    """A node has no truth value (a rule that branches on it is untraceable), is
    unhashable (``==`` builds a node), is slotted, and only numbers are lifted."""
    from leaseproto.core.tracing import Node, Untraceable, trace

    n = Node("var", ("x",))
    with pytest.raises(Untraceable, match="branched on a traced value"):
        bool(n)
    with pytest.raises(Untraceable, match="branched on a traced value"):
        trace(lambda x: 1.0 if x else 0.0, "x")
    with pytest.raises(TypeError):
        hash(n)
    assert not hasattr(n, "__dict__")
    with pytest.raises(Untraceable, match="cannot trace a str"):
        trace(lambda x: x + "s", "x")


def test_not_and_or_trace_fold_and_keep_what_is_unknown() -> None:
    from leaseproto.core.tracing import simplify, trace

    x = ("var", "x")
    lt = ("<", x, ("const", 1))
    negated = trace(lambda x: neg(x < 1), "x")
    assert negated.key == ("not", lt)
    assert simplify(negated, {}).key == ("not", lt)
    assert simplify(negated, {x: 0.5}).key == ("const", False)
    assert simplify(negated, {x: 2.0}).key == ("const", True)
    either = trace(lambda x, y: disj(x < 1, y), "x", "y")
    assert either.key == ("or", lt, ("var", "y"))
    assert simplify(either, {x: 0.5}).key == ("const", True)
    assert simplify(either, {x: 2.0}).key == ("var", "y")
    assert simplify(either, {x: 2.0, ("var", "y"): False}).key == ("const", False)
    # only a bool constant is folded away: a number operand is kept, as Python's ``and``
    # would return it
    with_number = trace(lambda x: conj(x < 1, 1), "x")
    assert simplify(with_number, {}).key == ("and", lt, ("const", 1))


def test_a_rule_that_fails_on_a_traced_value_is_untraceable() -> None:
    from leaseproto.core.tracing import Untraceable, trace

    with pytest.raises(Untraceable, match="TypeError"):
        trace(lambda x: x**2, "x")


def test_the_printer_hoists_each_loop_invariant_subterm_once() -> None:
    """A subterm of invariant names only (``now + e``, twice in ``vmax``'s ``if``) is
    named once in ``hoisted``; the printed expression reads that name and the
    rest, and computes what the tree does."""
    from leaseproto.core.sym import vmax
    from leaseproto.core.tracing import Printer, trace

    pr = Printer(frozenset({"now", "e"}))
    src = pr.expr(trace(lambda d, now, e: vmax(d, now + e), "d", "now", "e"))
    assert [name for name, _ in pr.hoisted] == ["_h0"]
    hoisted = ast.parse(pr.hoisted[0][1], mode="eval").body
    assert _parsed_back(hoisted) == ("+", ("var", "now"), ("var", "e"))
    names = {n.id for n in ast.walk(ast.parse(src, mode="eval")) if isinstance(n, ast.Name)}
    assert names == {"d", "_h0"}, src
    for d, now, e in ((1.0, 2.0, 3.0), (9.0, 2.0, 3.0), (5.0, 2.0, 3.0)):
        env = {"d": d, "now": now, "e": e}
        env["_h0"] = eval(pr.hoisted[0][1], {}, env)
        assert eval(src, {}, env) == vmax(d, now + e)


def _names_read(src: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(src, mode="eval")) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("capped", [False, True])
def test_the_generated_renewal_reads_only_what_a_live_lease_needs(capped: bool) -> None:
    """Simplified under :data:`S.LIVE` (the lease is GRANTED) and, for the new deadline,
    under the renewal applying: the test reads no state, the deadline neither the state
    nor the test again, and the loop loads no field it does not read."""
    form = S.renew_form(R.renew_rule, capped=capped)
    hoisted = {name for name, _ in form.hoisted}
    assert _names_read(form.exprs["applies"]) == {"now", "deadline"}
    fields = {"deadline", "cap_at"} if capped else {"deadline"}
    assert _names_read(form.exprs["deadline"]) - hoisted == fields
    assert "lease.state" not in form.source


def test_a_rule_whose_result_is_a_plain_value_is_still_generated() -> None:
    """A patched rule may return a constant where the real one returns a traced term
    (here: every live lease renews): the form is still generated, and renews."""

    def always(state: Any, deadline: Any, cap_at: Any, now: Any, extension: Any) -> Any:
        return True, now + extension

    form = S.renew_form(always, capped=False)
    assert form.traced
    lease = _L("a", R.GRANTED, 5.0, None)
    c = {"renew_unknown": 0, "renew_late": 0, "renew_lapsed": 0}
    assert form.fn(["a"], [lease], True, {}, 9.0, 2.0, None, c, always) == 1
    assert lease.deadline == 11.0 and lease.last_renewal == 9.0


def test_a_form_is_frozen() -> None:
    """Forms are cached per rule and shared by every table: none can be changed."""
    form = S.renew_form(R.renew_rule, capped=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        form.traced = False  # type: ignore[misc]


def _due_with_python_control_flow(state: int, deadline: float, now: float) -> bool:
    return state == R.GRANTED and deadline <= now


def test_an_untraceable_expiry_rule_is_called_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    form = S.expire_form(_due_with_python_control_flow, R.expire_state)
    assert not form.traced and "due_rule(" in form.source
    args = (_due_with_python_control_flow, R.expire_state)
    assert form.fn(R.GRANTED, 5.0, 5.0, *args) == R.EXPIRED
    assert form.fn(R.GRANTED, 5.0, 4.0, *args) is None
    t = LeaseTable(LeaseConfig())
    t.grant("a", now=0.0)
    monkeypatch.setattr(R, "expire_due", _due_with_python_control_flow)
    assert t.expire(now=29.0) == []
    assert [(r.req_id, r.reason) for r in t.expire(now=30.0)] == [("a", ReleaseReason.EXPIRED)]


def test_an_expiry_rule_with_a_term_of_now_alone_is_printed_inline() -> None:
    """One call has no loop to hoist ``now - 0.5`` out of: the form prints it inline."""

    def due_with_grace(state: Any, deadline: Any, now: Any) -> Any:
        return conj(state == R.GRANTED, deadline <= now - 0.5)

    form = S.expire_form(due_with_grace, R.expire_state)
    assert form.traced and form.hoisted == ()
    assert _names_read(form.exprs["due"]) == {"state", "deadline", "now"}
    args = (due_with_grace, R.expire_state)
    assert form.fn(R.GRANTED, 5.0, 5.5, *args) == R.EXPIRED
    assert form.fn(R.GRANTED, 5.0, 5.25, *args) is None
