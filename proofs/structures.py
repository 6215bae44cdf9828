"""Lemma L15: P's real lease table, run on z3 terms, does what the naive model does.

``LeaseTable`` (``core/table.py``, with its ``DeadlineQueue`` of ``core/deadlines.py``
and its renewal loops of ``core/renewal.py``) is *run* here, unchanged, on times that
are z3 terms: each scenario below is a short history of grants, heartbeats,
transfer-dones (with and without ``n``), aborts, queries and reaps over a few ids, at
instants ``t0 <= t1 <= ...`` that are unknowns (and some that are free, so that a
``now`` that went back is one of the paths), misuse among them. Where the code branches on a
symbolic value (a comparison of deadlines in the heap, a dict lookup of a deadline
bucket, the reaper's ``deadline <= now``, a tombstone's ttl) :class:`Explorer` asks
z3 which ways are feasible on the path so far and runs the history once per
feasible path. The same history is run, in the same path, through the naive model
of the spec (:class:`~leaseproto.checker.naive.NaiveLeaseTable`, one dict and a full
scan, written without the rules, with spec §10's misuse: :mod:`proofs.table_oracle`),
and the obligation says that on no path do the two differ: every return value
(releases with their reasons, times and order, verdict inputs, renewal counts,
``lost``, the ids a heartbeat payload renewed, ``lost_reason``), which calls are
refused as misuse, the live ids in grant order and each one's fields
(``lease_info``), how each ended id ended, ``next_deadline``, every counter of
``stats``, and the deadline queue's representation invariant (each live lease has one
entry, ``stale`` counts the entries of ended leases: :func:`_queue_shape`). Scenarios
reach the deadline calendar's whole-bucket reaping (a bucket of at least eight leases)
and its compaction (over a thousand stale entries, made at a concrete time before the
symbolic steps).

What the harness relies on beyond the table's public methods, so that a change
there is seen here: the queue's buckets, list of grants and ``stale`` count are read
for the representation invariant; a deadline is a dict key of the queue's buckets (so
:class:`HSym` hashes every term alike and a lookup compares with ``==``, a branch),
and ``grant`` checks the deadline's finiteness by comparison. Durations are concrete
(the config), times symbolic; counts are the scenario's.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import z3

from leaseproto.core.config import LeaseConfig
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.events import Releases
from leaseproto.core.table import LeaseTable, TableStats

from .loops import Check
from .symexec import Explorer, HSym, agree, explore, scenarios
from .table_oracle import OracleTable

SYSTEM = "structures"


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
        max_notification_bytes=64,  # ids of at most 49 bytes (rule C7)
    )


CONFIG, CAPPED = _config(capped=False), _config(capped=True)

# a scenario: (op, args) steps, one time each (``"now"``: FREE, an unknown not ordered
# after the others, or a constant); ops are LeaseTable's methods, on id ``a`` (``_b``:
# on ``b``; ``"id"``: on that one)
Step = tuple[str, dict[str, Any]]
FREE = "free"
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
LRA: Step = ("lost_reason", {"now": 0.0})
LRB: Step = ("lost_reason_b", {"now": 0.0})
BUCKET = [f"c{k}" for k in range(9)]  # one deadline's bucket, reaped whole (>= 8)
GC: Step = ("grant_many", {"ids": BUCKET})  # for the default ttl: the list of grants
GCT: Step = ("grant_many", {"ids": BUCKET, "ttl": 9.0})  # another ttl: a calendar bucket


def _hb(payload: bytes) -> Step:
    return ("renew_heartbeat", {"payload": payload, "lost": True})


#: misuse: each is refused and changes nothing (spec §10)
BAD: list[Step] = [
    ("grant", {}),  # a live id
    *(("grant", {"id": rid}) for rid in ("", "b,c", "HB:x", "OK", "é" * 25, "x" * 50, 5)),
    *(("grant_b", {"consumers": c}) for c in (0, True, 2**20 + 1, 1.5)),
    *(("grant_b", {"ttl": t}) for t in (0.0, -1.0, math.nan, math.inf, True)),
    *(("transfer_done", {"readers": n}) for n in (0, True, 2**20 + 1)),
    ("expire", {"now": math.nan}),
    ("renew", {"ids": ["a"], "now": True}),
    ("abort", {"now": math.inf}),
    ("transfer_done", {"now": -math.inf}),
    ("renew_heartbeat", {"payload": b"HB:a", "now": math.nan}),
    ("renew_heartbeat", {"payload": b"HB:a", "now": "5"}),
    ("renew", {"ids": ["a"], "now": "5"}),
    ("lost_reason", {"now": math.nan}),
]
HEARTBEATS: list[Step] = [
    _hb(b"HB:a,b"),
    _hb(b"HB:a,,b"),
    _hb(b"HB:b,u"),
    _hb(b"a:1"),
    _hb(b"HB:\xffa"),
    _hb(b"HB:a,OK"),
    _hb(b"HB:x" + b"y" * 49),
    ("renew_heartbeat", {"payload": bytearray(b"HB:a")}),
    ("renew_heartbeat", {"payload": b"HB:a"}),
]

SCENARIOS: list[tuple[str, LeaseConfig, list[Step]]] = [
    ("grant, renew, expire", CONFIG, [G, RA, EX, LRA, EX]),
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
    ("tombstone capacity and ttl", CONFIG, [G, GB, AB, ABB, EX, TD, TDB, LRA]),
    ("expire tombstone then reuse id", CONFIG, [G, EX, TD, G, RA, EX]),
    ("two grants renewed together, expire", CONFIG, [G, GB, RAB, EX, EX]),
    ("two grants, one renewed, expire", CONFIG, [G, GB, RA, EX, EX]),
    ("two short grants renewed together twice", CONFIG, [GT, GBT, RAB, EX, RAB, EX]),
    ("two short grants, one renewed", CONFIG, [GT, GBT, RAB, RA, EX, EX]),
    ("capped renewals", CAPPED, [G, RA, RA, EX, RAB]),
    ("capped two leases, staged, expire", CAPPED, [TDB, GT, GB, RAB, EX, ND, EX]),
    ("capped aborts and late transfers", CAPPED, [G, GB, ABB, TDB, RA, EX, TD]),
    ("misuse changes nothing", CAPPED, [G, *BAD, ("grant_b", {"now": FREE}), EX]),
    ("heartbeat payloads", CONFIG, [G, GB, *HEARTBEATS[:4], AB, *HEARTBEATS[4:]]),
    ("stale and renewed entries met by next_deadline", CONFIG, [G, GB, AB, RB, ND, EX, ND]),
    (
        "renew ids given as a tuple and an iterator",
        CONFIG,
        [
            G,
            GB,
            ("renew", {"ids": ("a", "b"), "as": "tuple"}),
            ("renew", {"ids": ["u", "b"], "as": "iter"}),
        ],
    ),
    ("a full bucket is reaped whole", CONFIG, [GC, ("grant", {"ttl": 9.0}), EX, EX]),
    (
        "a bucket with a renewed and a stale entry",
        CONFIG,
        [GC, ("renew", {"ids": ["c3"]}), ("abort", {"id": "c5"}), EX, EX],
    ),
    (
        "a calendar bucket with a renewed and a stale entry",
        CONFIG,
        [GCT, ("renew", {"ids": ["c3"]}), ("abort", {"id": "c5"}), EX, EX],
    ),
    ("a reused id's old entry is stale", CONFIG, [G, AB, G, LRA, EX, ND]),
    (
        "a stale entry ahead of a live one in a calendar bucket, next_deadline",
        CONFIG,
        [("grant_many", {"ids": ["a", "b"], "ttl": 3.0}), AB, ND, EX, ND],
    ),
    (
        "compaction keeps the live leases",
        CONFIG,
        # a lease in the list of grants (``a``) and one in the calendar (``b``)
        [G, ("grant_b", {"ttl": 9.0}), ("churn", {"n": 1030, "now": 0.0}), EX],
    ),
    (
        "a first heartbeat at -inf is refused",
        CONFIG,
        [("renew_heartbeat", {"payload": b"HB:a", "now": -math.inf}), G, EX],
    ),
    ("staging forgets its oldest entry first", CAPPED, [TD, TDB, EX, GB, G]),
    (
        "an overflowing deadline is refused",
        CONFIG,
        [
            ("grant", {"now": 1.0}),
            ("grant_b", {"ttl": 1.7e308, "now": 1.7e308}),
            ("expire", {"now": 1.7e308}),
        ],
    ),
]
_IDS = ("a", "b", "c3", "c5")


def _model_next(model: OracleTable) -> Any:
    ds = [x["deadline"] for x in model.leases.values()]
    return min(ds) if ds else None


def _observe(table: LeaseTable, model: OracleTable) -> Iterator[tuple[str, Any, Any]]:
    """What the table shows after a step, and the model's of it, one at a time (so what
    is compared before a query raises still counts)."""
    yield "live", table.live(), list(model.leases)
    held = [len(table), *(r in table for r in _IDS)]
    yield "held", held, [len(model), *(r in model for r in _IDS)]
    leases = model.leases
    got = {r: table.deadline(r) for r in _IDS}
    yield "deadline", got, {r: (leases[r]["deadline"] if r in leases else None) for r in _IDS}
    yield "lease_info", [table.lease_info(r) for r in _IDS], [model.lease_info(r) for r in _IDS]
    ends = {r: table.ended(r) for r in _IDS}
    yield "ended", ends, {r: (model.ended[r][0] if r in model.ended else None) for r in _IDS}
    yield "counters", _counts(table.stats), _model_counts(model)
    yield "queue", _queue_shape(table), _QUEUE_OK


#: the deadline queue's representation invariant, as :func:`_queue_shape` states it
_QUEUE_OK = {"one entry per live lease": True, "stale counts the ended leases' entries": True}


def _queue_shape(table: LeaseTable) -> dict[str, bool]:
    """The deadline queue's representation invariant, stated without comparing a time
    (so it adds no branch): each live lease has exactly one entry (in the calendar or
    the list of grants), and ``stale``, on which compaction is decided, is the number
    of entries whose lease ended. No answer shows these, so a queue that keeps a dead
    entry, loses a live one or miscounts its stale ones is seen here first."""
    q = table._queue
    entries = [x for bucket in q._buckets.values() for x in bucket] + q._grants[q._head :]
    live = table._leases
    mine = [x for x in entries if live.get(x.req_id) is x]
    return {
        "one entry per live lease": sorted(x.req_id for x in mine) == sorted(live),
        "stale counts the ended leases' entries": q.stale == len(entries) - len(mine),
    }


def _counts(stats: TableStats) -> dict[str, int]:
    return {f.name: getattr(stats, f.name) for f in fields(stats)}


def _model_counts(model: OracleTable) -> dict[str, int]:
    names = [f.name for f in fields(TableStats)]
    return {k: model.counts.get(k, 0) for k in names} | {"live": len(model.leases)}


def _churn(obj: Any, n: int, now: float) -> None:
    """``n`` leases granted and aborted at ``now``: as many stale queue entries."""
    for k in range(n):
        obj.grant(f"k{k}", now=now)
        obj.abort(f"k{k}", now=now)


def _step(obj: Any, op: str, args: dict[str, Any], now: Any, model: bool) -> Any:
    """One step's answer: ``(value, lost)``, or ``("misuse",)`` when it is refused."""
    rid = args.get("id", "b" if op.endswith("_b") else "a")
    name = op.removesuffix("_b")
    kw = {k: v for k, v in args.items() if k in ("consumers", "ttl", "readers")}
    lost: list[str] | None = [] if args.get("lost") else None
    try:
        if name == "grant":
            return obj.grant(rid, now=now, **kw), None
        if name == "grant_many":
            return [obj.grant(r, now=now, **kw) for r in args["ids"]], None
        if name == "renew":
            ids = args["ids"]
            given = (
                tuple(ids)
                if args.get("as") == "tuple"
                else iter(ids)
                if args.get("as")
                else list(ids)
            )
            return obj.renew(given, now=now, lost=lost), lost
        if name == "renew_heartbeat":
            return obj.renew_heartbeat(args["payload"], now=now, lost=lost), lost
        if name == "transfer_done":
            return obj.transfer_done(rid, now=now, **kw), None
        if name == "abort":
            return obj.abort(rid, now=now), None
        if name == "expire":
            out = obj.expire(now=now)
            # the table's Releases: the records it builds when read, and its ids (read
            # without building them); the model's list: its records and their ids
            ids = out.ids if isinstance(out, Releases) else [r.req_id for r in out]
            return (list(out), list(ids)), None
        if name == "lost_reason":
            return obj.lost_reason(rid, now=now), None
        if name == "churn":
            _churn(obj, args["n"], now)
            return None, None
        if name == "next_deadline":
            return (obj.next_deadline() if not model else _model_next(obj)), None
    except LocalProtocolError:
        return ("misuse",)
    raise ValueError(op)


def scenario_check(name: str, config: LeaseConfig, steps: list[Step]) -> Check:
    """The table and the naive model on every feasible path of one scenario."""
    ordered = [z3.Real(f"t{i}") for i in range(len(steps))]
    free = [z3.Real(f"u{i}") for i in range(len(steps))]
    hyps = [a <= b for a, b in itertools.pairwise(ordered)]
    # a constant time orders the unknowns around it: those before it are not later
    for i, (_, args) in enumerate(steps):
        at = args.get("now")
        if isinstance(at, float) and math.isfinite(at):
            hyps += [t <= at for t in ordered[:i]] + [t >= at for t in ordered[i + 1 :]]
    check = Check(hyps, [])
    ex = Explorer(hyps)

    def run(pairs: list[tuple[str, Any]]) -> None:
        table, model = LeaseTable(config), OracleTable(config)
        # the record's defaults: a table that counted nothing
        pairs.append(("TableStats()", agree(_counts(TableStats()), _model_counts(model))))
        for i, (op, args) in enumerate(steps):
            at = args.get("now", ordered[i])
            now = HSym(free[i] if at is FREE else at, ex) if z3.is_expr(at) or at is FREE else at
            got = _step(table, op, args, now, model=False)
            want = _step(model, op, args, now, model=True)
            label = f"step {i} {op}"
            pairs.append((label, agree(got, want)))
            for what, g, w in _observe(table, model):
                pairs.append((f"{label}: {what}", agree(g, w)))

    return explore(check, name, ex, run)


def checks(only: str = "") -> list[tuple[str, Check]]:
    """Every scenario's check (those whose label contains ``only``)."""
    todo = [(name, functools.partial(scenario_check, name, c, st)) for name, c, st in SCENARIOS]
    return scenarios("L15 LeaseTable = naive model: ", only, todo)
