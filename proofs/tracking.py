"""Lemma L16: D's real heartbeat tracker, run on z3 times, does what the naive model does.

``HeartbeatTracker`` (``core/tracker.py``) is *run* here, unchanged, on times that
are z3 terms, as L15 runs the lease table: each scenario below is a short history of
``track``, ``untrack``, ``drop_engine``, ``due`` (with and without engines whose
handshake is pending) and ``next_due`` over two engines, at instants that are
unknowns (``t0 <= t1 <= ...``, and a few that are free, so that a ``now`` that went
back is one of the paths). Where the code branches on a time (its idle shortcut, the
oldest-first scan of the engines' last heartbeats, the threshold it derives from
the rule) :class:`~proofs.structures.Explorer` runs every feasible way. The naive
model of spec §7 (:class:`~leaseproto.checker.naive_tracker.NaiveTracker`: one dict
of requests, one of engines, a full scan, written without the rules) runs the same
history on the same path, and the obligation says that on no path do the two
differ: every return value (``due``'s engines in order with P's ids, the ids
``drop_engine`` returns, ``next_due``), which calls are refused as misuse, the
engines and each one's requests, each request's engine and P's id, every counter of
``stats``, and the heartbeat messages ``payloads`` cuts from each ``due`` list
(against the splitting rule of spec §3.4, at several sizes).

The one thing the harness substitutes: the tracker finds its threshold with
``math.isnan`` and ``math.nextafter`` on a time. While a scenario runs, the
``math`` the core's modules see answers those on a z3 term
(:func:`~proofs.symexec.symbolic_math`: a real is never NaN; the float next to
``t`` is ``t`` plus or minus a fresh positive unknown, so no rule can be asked at a
value between the two) and passes every float to :mod:`math`.
Times are reals here: the IEEE rounding the threshold search exists for is
checked by ``tests/test_tracker.py`` on doubles.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import z3

from leaseproto.checker.naive_tracker import NaiveTracker
from leaseproto.core.config import LeaseConfig
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.tracker import HeartbeatTracker, TrackerStats

from .loops import Check
from .symexec import Explorer, HSym, SymMath, agree, explore, scenarios, symbolic_math

SYSTEM = "tracker"


def _config() -> LeaseConfig:
    """Heartbeat every 1 s; messages of at most 64 bytes (the least there is), so ids
    of at most 49 bytes (rule C7) and a heartbeat of a few ids is cut."""
    return LeaseConfig(
        kv_lease_duration=6.0,
        heartbeat_interval=1.0,
        lease_extension=4.0,
        max_notification_bytes=64,
    )


CONFIG = _config()

# a scenario: (op, args) steps; a step that takes ``now`` takes the next ordered time
# t_i, or a free one (``"now": "free"``) or the given constant
Step = tuple[str, dict[str, Any]]
T1: Step = ("track", {"req": "r1", "engine": "e", "remote": "p1"})
T2: Step = ("track", {"req": "r2", "engine": "e", "remote": "p-two"})
T3: Step = ("track", {"req": "r3", "engine": "f"})
T4: Step = ("track", {"req": "r4", "engine": "e", "remote": "x" * 49})  # the longest
D: Step = ("due", {})
DE: Step = ("due", {"pending": ("e",)})
DF: Step = ("due", {"pending": ["f", "g"]})
U1: Step = ("untrack", {"req": "r1"})
U3: Step = ("untrack", {"req": "r3"})
UX: Step = ("untrack", {"req": "nobody"})
XE: Step = ("drop_engine", {"engine": "e"})
XF: Step = ("drop_engine", {"engine": "f"})
ND: Step = ("next_due", {})
FREE = "free"  # a step's ``now``: an unknown not ordered after the others
#: misuse: tracked twice, ids that cannot go on the wire, times that are no times
BAD: list[Step] = [
    ("track", {"req": "r1", "engine": "f"}),
    ("track", {"req": "r5", "engine": "e", "remote": "a,b"}),
    ("track", {"req": "r5", "engine": "e", "remote": "HB:x"}),
    ("track", {"req": "r5", "engine": "e", "remote": "OK"}),
    ("track", {"req": "", "engine": "e"}),
    ("track", {"req": "r\x7f", "engine": "e"}),
    ("track", {"req": "r5", "engine": "e", "remote": "é" * 25}),  # 25 chars, 50 bytes
    ("track", {"req": "r5", "engine": "e", "remote": "y" * 50}),
    ("track", {"req": 5, "engine": "e", "remote": "p5"}),
    ("track", {"req": "r5", "engine": "e", "now": math.nan}),
    ("track", {"req": "r5", "engine": "e", "now": True}),
    ("track", {"req": "r5", "engine": "e", "now": False}),
    ("track", {"req": "r5", "engine": "e", "now": "5"}),
    ("track", {"req": "r5", "engine": "e", "now": math.inf}),
    ("due", {"now": -math.inf}),
    ("due", {"now": False}),
    ("due", {"now": True}),
    ("due", {"now": "5"}),
]

SCENARIOS: list[tuple[str, list[Step]]] = [
    ("one engine, heartbeats every interval", [T1, D, D, ND, D, T2, D, U1, ND, D, U3]),
    ("an empty tracker", [D, ND, UX, XE, ("due", {"now": True}), T1, D]),
    ("two engines, one pending", [T1, T3, DE, D, T2, DF, D, DE]),
    ("untrack forgets, a new engine is due at once", [T3, T1, D, U3, ND, T3, D, D, UX, D]),
    ("drop an engine", [T1, T2, T3, D, XE, ND, D, XF, XE, D, ND]),
    ("engine order after a forgotten engine", [T3, T1, D, U3, T3, T4, D, D, DE, D]),
    ("cut heartbeats, pending first turn", [T1, T2, T4, DE, D, U1, D, D]),
    (
        "misuse changes nothing",
        [T1, *BAD, D, ("track", {"req": "r2", "engine": "f", "now": FREE}), D],
    ),
    ("a time that goes back", [T1, D, ("due", {"now": FREE}), T3, ("due", {"now": FREE}), D]),
]

#: the sizes each ``due`` list is cut at (None: the config's)
_SIZES = (3, 4, 5, 7, 8, 10, 11, 51, 52, None)


def _call(obj: Any, op: str, args: dict[str, Any], now: Any) -> Any:
    """``obj``'s answer to one step: ``("ok", value)``, ``("misuse",)`` for a
    :class:`LocalProtocolError`, ``("value error",)`` for a ``ValueError``."""
    try:
        if op == "track":
            value = obj.track(
                args["req"], engine_id=args["engine"], remote_req_id=args.get("remote"), now=now
            )
        elif op == "due":
            value = obj.due(now=now, pending=args.get("pending", ()))
            if isinstance(value, dict):  # the engines' order is part of the answer
                value = list(value.items())
        elif op == "untrack":
            value = obj.untrack(args["req"])
        elif op == "drop_engine":
            value = obj.drop_engine(args["engine"])
        elif op == "next_due":
            value = obj.next_due()
        else:
            raise ValueError(op)
    except LocalProtocolError:
        return ("misuse",)
    return ("ok", value)


def _cut(obj: Any, ids: list[str], size: int | None) -> Any:
    try:
        return obj.payloads(ids, max_bytes=size)
    except ValueError:
        return "value error"


_REQS = ("r1", "r2", "r3", "r4", "r5", "nobody")
_ENGINES = ("e", "f", "g")


def _counts(stats: TrackerStats) -> dict[str, int]:
    return {f.name: getattr(stats, f.name) for f in fields(stats)}


def _observe(tr: HeartbeatTracker, model: NaiveTracker) -> Iterator[tuple[str, Any, Any]]:
    """What the tracker shows after a step, and the model's of it, one at a time (so
    what is compared before a query raises still counts)."""
    yield "engines", tr.engines(), model.engines()
    yield "requests", [tr.requests(e) for e in _ENGINES], [model.request_ids(e) for e in _ENGINES]
    yield "engine_of", [tr.engine_of(r) for r in _REQS], [model.engine_of(r) for r in _REQS]
    yield "remote_id", [tr.remote_id(r) for r in _REQS], [model.remote_id(r) for r in _REQS]
    got = [len(tr), *(r in tr for r in _REQS)]
    yield "tracked", got, [len(model.requests), *(r in model.requests for r in _REQS)]
    yield "stats", _counts(tr.stats), model.stats()
    yield "next_due", tr.next_due(), model.next_due()


def scenario_check(name: str, steps: list[Step]) -> Check:
    """The tracker and the naive model on every feasible path of one scenario."""
    ordered = [z3.Real(f"t{i}") for i in range(len(steps))]
    free = [z3.Real(f"u{i}") for i in range(len(steps))]
    hyps = [a <= b for a, b in itertools.pairwise(ordered)]
    check = Check(hyps, [])
    ex = Explorer(hyps)

    def run(pairs: list[tuple[str, Any]]) -> None:
        tr, model = HeartbeatTracker(CONFIG), NaiveTracker(CONFIG)
        shim = SymMath()
        zero = TrackerStats()  # the record's defaults: a tracker that counted nothing
        pairs.append(("TrackerStats()", agree(_counts(zero), model.stats())))
        with symbolic_math(shim):
            for i, (op, args) in enumerate(steps):
                when = args.get("now", "ordered")
                now = (
                    HSym(ordered[i], ex)
                    if when == "ordered"
                    else HSym(free[i], ex)
                    if when == FREE
                    else when
                )
                got, want = _call(tr, op, args, now), _call(model, op, args, now)
                label = f"step {i} {op}"
                pairs.append((label, agree(got, want)))
                if op == "due" and want[0] == "ok":  # each list cut by both
                    # the tracker's own list (payloads skips the repeat check for what
                    # due returned) and a copy of it (checked), against the model's
                    own = dict(got[1]) if got[0] == "ok" else {}
                    for engine, ids in want[1]:
                        mine = own.get(engine, ids)
                        for size in _SIZES:
                            want_cut = _cut(model, list(ids), size)
                            for given in (mine, list(mine)):
                                cut = agree(_cut(tr, given, size), want_cut)
                                pairs.append((f"{label}: payloads({ids}, {size})", cut))
                for what, g, w in _observe(tr, model):
                    pairs.append((f"{label}: {what}", agree(g, w)))

    return explore(check, name, ex, run)


def checks(only: str = "") -> list[tuple[str, Check]]:
    """Every scenario's check (those whose label contains ``only``)."""
    todo = [(name, functools.partial(scenario_check, name, steps)) for name, steps in SCENARIOS]
    return scenarios("L16 HeartbeatTracker = naive model: ", only, todo)
