"""Fast copies of the real core objects, for branching the search.

``copy.deepcopy`` works but spends most of the checker's time walking small
dicts. These copy exactly the containers the objects mutate and share what
they never mutate again (the configuration, frozen messages, ended leases that
only stale queue entries still point at).
"""

from __future__ import annotations

import copy
import itertools
from collections import OrderedDict
from typing import Any, TypeVar

from ..core.push import PushRegistrations, _Registration
from ..core.table import LeaseTable
from ..core.tracker import HeartbeatTracker

__all__ = ["clone_registrations", "clone_table", "clone_tracker"]

T = TypeVar("T")


def _clone_slots(obj: T) -> T:
    cls = type(obj)
    new = object.__new__(cls)
    for klass in cls.__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(obj, name):
                setattr(new, name, getattr(obj, name))
    return new


def _copy_value(v: Any) -> Any:
    if isinstance(v, OrderedDict):
        return OrderedDict((k, list(x) if isinstance(x, list) else x) for k, x in v.items())
    if isinstance(v, dict):
        return {k: (dict(x) if isinstance(x, dict) else x) for k, x in v.items()}
    if isinstance(v, (list, set)):
        return type(v)(v)
    return v


def clone_table(t: LeaseTable) -> LeaseTable:
    new = copy.copy(t)
    leases = t._leases
    fresh = {rid: _clone_slots(lease) for rid, lease in leases.items()}
    by_obj = {id(leases[rid]): lease for rid, lease in fresh.items()}
    for name, value in vars(t).items():
        if name == "_leases":
            new._leases = fresh
        elif name == "_queue":  # the deadline queue holds the leases: its copy, the copies
            new._queue = value.copy(lambda lease: by_obj.get(id(lease), lease))
        elif isinstance(value, itertools.count):
            n = next(value)
            setattr(t, name, itertools.count(n))
            setattr(new, name, itertools.count(n))
        else:
            setattr(new, name, _copy_value(value))
    return new


def clone_tracker(t: HeartbeatTracker) -> HeartbeatTracker:
    new = copy.copy(t)
    by_engine = {e: copy.copy(reqs) for e, reqs in t._by_engine.items()}
    for name, value in vars(t).items():
        if name == "_by_engine":
            new._by_engine = by_engine
        elif name == "_engine_of":  # (its engine's requests in _by_engine, remote id)
            new._engine_of = {rid: (by_engine[v[0].engine], v[1]) for rid, v in value.items()}
        elif isinstance(value, (dict, list, set)):
            setattr(new, name, type(value)(value))
        else:
            setattr(new, name, value)
    return new


def clone_registrations(g: PushRegistrations) -> PushRegistrations:
    new = object.__new__(PushRegistrations)
    new._regs = {r: _Registration(set(e.owed), e.failed, e.ended) for r, e in g._regs.items()}
    new._free = list(g._free)
    return new
