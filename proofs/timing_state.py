"""The state, options and timing conditions of the composed model of P and D in
real time (:mod:`proofs.timing_model` builds its transitions on them).

``FIELDS`` are the state of every system :func:`~proofs.timing_model.build`
makes, ``READ_FIELDS`` the fields it adds with ``reads=True``; ``t1`` and ``t2``
are the spec's conditions T1 and T2 (§5.3) over the model's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from .kit import Bool, Int, Real

__all__ = ["FIELDS", "READ_FIELDS", "Options", "drift", "hq", "t1", "t2", "vmax"]

FIELDS = {
    "tau": Real,
    "cP": Real,
    "cD": Real,
    "cW": Real,
    "st": Int,
    "deadline": Real,
    "cg": Real,
    "tg": Real,
    "cap_at": Real,
    "tend": Real,
    "lastP": Real,
    "lastDs": Real,
    "tracked": Bool,
    "ttrack": Real,
    "conn": Bool,
    "silent": Bool,
    "tsil": Real,
    "hasD": Bool,
    "lastD": Real,
    "tsD": Real,
    "hasO": Bool,
    "tso": Real,
    "out": Bool,
    "tout": Real,
    "arr": Bool,
    "tarr": Real,
    "renewed": Bool,
    "cr": Real,
    "tr": Real,
    "hash": Bool,
    "ch": Real,
    "th": Real,
}

#: Fields of D's read and P's verdicts, in systems built with ``reads=True``.
READ_FIELDS = {
    "done": Int,
    "rd": Int,
    "rbad": Bool,
    "okv": Bool,
    "nkv": Bool,
    "used": Bool,
}


@dataclass(frozen=True)
class Options:
    """``assume``: which of T1/T2 are axioms; ``actual``: bounds whose real value is
    a separate parameter ``<name>_act`` (the model obeys it, T1/T2 use the assumed
    one); ``naive``: ``"assign"`` (renewal assigns) or ``"two_clocks"`` (the reaper
    compares P's deadline with a worker's clock)."""

    cap: bool = False
    strays: str = "free"
    #: add D's READ, P's transfer-done handling with verdicts, other readers'
    #: and replayed transfer-dones, aborts, and D's use of a read (I13)
    reads: bool = False
    assume: frozenset[str] = frozenset({"T1", "T2"})
    actual: frozenset[str] = frozenset()
    naive: str | None = None
    #: a heartbeat that arrived is handled at P's next step (False: the old model,
    #: in which P could step on with it unhandled; kept to show its schedules
    #: are no behaviour of the implementation, tests/test_cx_replay.py)
    arrivals: bool = True


def hq(p: Any) -> Any:
    """Longest real time between two heartbeats' interval timers: ``H / (1 - rho)``."""
    return p.H / (1 - p.rho)


def vmax(a: Any, b: Any) -> Any:
    return z3.If(a >= b, a, b)


def t1(p: Any) -> Any:
    """T1 first heartbeat: R + max(K, H/(1-rho)) + SD + dl + SP < L/(1+rho)."""
    return p.R + vmax(p.K, hq(p)) + p.SD + p.dl + p.SP < p.L / (1 + p.rho)


def t2(p: Any) -> Any:
    """T2 steady state: H/(1-rho) + SD + dl + SP < E/(1+rho)."""
    return hq(p) + p.SD + p.dl + p.SP < p.E / (1 + p.rho)


def drift(c: Any, c2: Any, dt: Any, rho: Any) -> Any:
    return z3.And(c2 - c >= (1 - rho) * dt, c2 - c <= (1 + rho) * dt)
