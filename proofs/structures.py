"""Lemma L15: P's real lease table, run on z3 terms, does what the naive model does.

``LeaseTable`` (``core/table.py``, with its ``DeadlineQueue`` of ``core/deadlines.py``
and its renewal loops of ``core/renewal.py``) is *run* here, unchanged, on times that
are z3 terms: each scenario below is a short history of grants, heartbeats,
transfer-dones (with and without ``n``), aborts, queries and reaps over two ids, at
instants ``t0 <= t1 <= ...`` that are unknowns. Where the code branches on a
symbolic value (a comparison of deadlines in the heap, a dict lookup of a deadline
bucket, the reaper's ``deadline <= now``, a tombstone's ttl) :class:`Explorer` asks
z3 which ways are feasible on the path so far and runs the history once per
feasible path. The same history is run, in the same path, through the naive model
of the spec (:class:`~leaseproto.checker.naive.NaiveLeaseTable`, one dict and a full
scan, written without the rules), and the obligation says that on no path do the
two differ: every return value (releases with their reasons, times and order,
verdict inputs, renewal counts, ``lost``), the live ids and their deadlines, how
each ended id ended, ``next_deadline`` and every counter of ``stats``.

What the harness relies on beyond the table's public methods, so that a change
there is seen here: a deadline is a dict key of the queue's buckets (so
:class:`HSym` hashes every term alike and a lookup compares with ``==``, a branch),
and ``grant`` checks the deadline's finiteness by comparison. Durations are concrete
(the config), times symbolic; counts are the scenario's.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from typing import Any

import z3

from leaseproto.checker.naive import NaiveLeaseTable
from leaseproto.core.config import LeaseConfig
from leaseproto.core.events import Releases
from leaseproto.core.table import LeaseTable

from .loops import Check, Sym, _term

SYSTEM = "structures"

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


class Explorer:
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

    def runs(self, fn: Callable[[], Any]) -> Iterator[tuple[Any, Any]]:
        """``(path condition, fn's result)`` for every feasible path through ``fn``."""
        self.forced, self.open = [], []
        while True:
            self.taken, self.conds = [], []
            try:
                result = fn()
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

    def _op(self, other: Any, f: Callable[[Any, Any], Any], *, flip: bool = False) -> HSym:
        if isinstance(other, float) and math.isinf(other) and f in _CMP_INF:
            g = _MIRROR[f] if flip else f
            val = _CMP_INF[g] if other > 0 else not _CMP_INF[g]
            if g in (operator.eq, operator.ne):
                val = _CMP_INF[g]
            return HSym(z3.BoolVal(val), self.paths)
        a, b = self.t, _term(other)
        return HSym(f(b, a) if flip else f(a, b), self.paths)


def _config(*, capped: bool) -> LeaseConfig:
    """Small capacities, so eviction is reached in a few steps; a cap, or none."""
    return LeaseConfig(
        kv_lease_duration=6.0,
        lease_extension=4.0,
        max_lease_lifetime=8.0 if capped else None,
        tombstone_ttl=10.0,
        tombstone_capacity=2 if capped else 1,
        staging_ttl=5.0,
        staging_capacity=2 if capped else 1,
    )


CONFIG, CAPPED = _config(capped=False), _config(capped=True)

# a scenario: (op, args) steps, one time each; ops are LeaseTable's methods
Step = tuple[str, dict[str, Any]]
G: Step = ("grant", {})
GB: Step = ("grant_b", {})
G2: Step = ("grant", {"consumers": 2})
GT: Step = ("grant", {"ttl": 3.0})
GBT: Step = ("grant_b", {"ttl": 3.0})
RA: Step = ("renew", {"ids": ["a"]})
RB: Step = ("renew", {"ids": ["b"]})
RAB: Step = ("renew", {"ids": ["a", "b"], "lost": True})
RBA: Step = ("renew", {"ids": ["b", "a", "u"], "lost": True})
TD: Step = ("transfer_done", {})
TD2: Step = ("transfer_done", {"readers": 2})
TDB: Step = ("transfer_done_b", {})
AB: Step = ("abort", {})
ABB: Step = ("abort_b", {})
EX: Step = ("expire", {})
ND: Step = ("next_deadline", {})

SCENARIOS: list[tuple[str, LeaseConfig, list[tuple[str, dict[str, Any]]]]] = [
    ("grant, renew, expire", CONFIG, [G, RA, EX, EX]),
    ("two grants, renewals reorder, expire", CONFIG, [GT, GB, RA, EX, EX]),
    ("renewed lease met in the queue, next_deadline", CONFIG, [G, GBT, RA, ND, EX]),
    ("renew both with lost after an expiry", CONFIG, [GT, GB, EX, RAB, RBA]),
    ("transfer-done of two readers, late", CONFIG, [G2, TD, RA, TD, TD]),
    ("transfer-done with n, abort, late abort", CONFIG, [G, TD2, TD2, ABB, AB]),
    ("staged transfer-done with n applied at grant", CONFIG, [TD2, G, RA, TD2, EX]),
    ("two staged transfer-dones with n complete at grant", CONFIG, [TD2, TD2, G, EX]),
    ("staged transfer-done without n, then abort", CONFIG, [TD, G2, TD, AB]),
    ("staged abort applied at grant", CONFIG, [AB, G, TD, EX]),
    ("staging capacity and ttl", CONFIG, [TD, TDB, EX, G, GB]),
    ("tombstone capacity and ttl", CONFIG, [G, GB, AB, ABB, EX, TD, TDB]),
    ("expire tombstone then reuse id", CONFIG, [G, EX, TD, G, RA, EX]),
    ("two grants renewed together, expire", CONFIG, [G, GB, RAB, EX, EX]),
    ("two grants, one renewed, expire", CONFIG, [G, GB, RA, EX, EX]),
    ("two short grants renewed together twice", CONFIG, [GT, GBT, RAB, EX, RAB, EX]),
    ("two short grants, one renewed", CONFIG, [GT, GBT, RAB, RA, EX, EX]),
    ("capped renewals", CAPPED, [G, RA, RA, EX, RAB]),
    ("capped two leases, staged, expire", CAPPED, [TDB, GT, GB, RAB, EX, ND, EX]),
    ("capped aborts and late transfers", CAPPED, [G, GB, ABB, TDB, RA, EX, TD]),
]


def _agree(got: Any, want: Any) -> Any:
    """A z3 formula: ``got`` (the table's) is ``want`` (the model's)."""
    if isinstance(got, Releases):  # expire's sequence: the releases it holds
        got = list(got)
    if isinstance(got, Sym) or isinstance(want, Sym):
        if isinstance(got, Sym) != isinstance(want, Sym) and (got is None or want is None):
            return z3.BoolVal(False)
        return _term(got) == _term(want)
    if is_dataclass(got) and not isinstance(got, type):
        if type(got) is not type(want):
            return z3.BoolVal(False)
        return z3.And(*(_agree(getattr(got, f.name), getattr(want, f.name)) for f in fields(got)))
    if isinstance(got, (list, tuple)):
        if not isinstance(want, (list, tuple)) or len(got) != len(want):
            return z3.BoolVal(False)
        return z3.And(True, *(_agree(a, b) for a, b in zip(got, want, strict=True)))
    if isinstance(got, dict):
        if not isinstance(want, dict) or sorted(got) != sorted(want):
            return z3.BoolVal(False)
        return z3.And(True, *(_agree(got[k], want[k]) for k in got))
    return z3.BoolVal(bool(got == want))


def _model_next(model: NaiveLeaseTable) -> Any:
    ds = [x["deadline"] for x in model.leases.values()]
    return min(ds) if ds else None


def _observe(table: LeaseTable, model: NaiveLeaseTable) -> dict[str, Any]:
    """What the table shows after a step, and the model's of it: (got, want) pairs."""
    stats = table.stats
    counts = {f.name: getattr(stats, f.name) for f in fields(stats) if f.name != "live"}
    want_counts = {k: model.counts.get(k, 0) for k in counts}
    ended = {r: table.ended(r) for r in ("a", "b")}
    want_ended = {r: (model.ended[r][0] if r in model.ended else None) for r in ("a", "b")}
    return {
        "live": (sorted(table.live()), sorted(model.leases)),
        "deadline": (
            {r: table.deadline(r) for r in ("a", "b")},
            {r: (model.leases[r]["deadline"] if r in model.leases else None) for r in ("a", "b")},
        ),
        "ended": (ended, want_ended),
        "counters": (counts, want_counts),
    }


def _step(
    obj: Any, op: str, args: dict[str, Any], now: Any, model: bool
) -> tuple[Any, list[str] | None]:
    rid = "b" if op.endswith("_b") else "a"
    name = op.removesuffix("_b")
    if name == "grant":
        return obj.grant(rid, now=now, **args), None
    if name == "renew":
        lost: list[str] | None = [] if args.get("lost") else None
        return obj.renew(list(args["ids"]), now=now, lost=lost), lost
    if name == "transfer_done":
        return obj.transfer_done(rid, now=now, **args), None
    if name == "abort":
        return obj.abort(rid, now=now), None
    if name == "expire":
        return obj.expire(now=now), None
    if name == "next_deadline":
        return (obj.next_deadline() if not model else _model_next(obj)), None
    raise ValueError(op)


def scenario_check(
    name: str, config: LeaseConfig, steps: list[tuple[str, dict[str, Any]]]
) -> Check:
    """The table and the naive model on every feasible path of one scenario."""
    times = [z3.Real(f"t{i}") for i in range(len(steps))]
    hyps = [a <= b for a, b in itertools.pairwise(times)]
    check = Check(hyps, [])
    ex = Explorer(hyps)

    def run() -> list[tuple[str, Any]]:
        table, model = LeaseTable(config), NaiveLeaseTable(config)
        pairs: list[tuple[str, Any]] = []
        for i, (op, args) in enumerate(steps):
            now = HSym(times[i], ex)  # type: ignore[arg-type]
            if op.removesuffix("_b") == "grant" and (
                ("b" if op.endswith("_b") else "a") in model.leases
            ):
                continue  # a live id is not granted again (a misuse the table refuses)
            got = _step(table, op, args, now, model=False)
            want = _step(model, op, args, now, model=True)
            label = f"step {i} {op}"
            pairs.append((label, _agree(got, want)))
            for what, (g, w) in _observe(table, model).items():
                pairs.append((f"{label}: {what}", _agree(g, w)))
        return pairs

    try:
        for pc, pairs in ex.runs(run):
            for label, ok in pairs:
                if not z3.is_true(ok):
                    check.bad.append((f"{name}, {label}", z3.And(pc, z3.Not(ok))))
    except Exception as exc:  # the table did what no path can: the check fails
        check.error = f"{name}: raised {type(exc).__name__}: {exc}"
    return check


def checks(only: str = "") -> list[tuple[str, Check]]:
    """Every scenario's check (those whose label contains ``only``)."""
    out = []
    for name, config, steps in SCENARIOS:
        label = f"L15 LeaseTable = naive model: {name}"
        if only in label:
            out.append((label, scenario_check(name, config, steps)))
    return out
