"""The invariants of the lease-table system (:mod:`proofs.table_model`), by the
spec's ids: what ``LeaseTable`` relies on across leases.

* ``L11`` (the B1 property): every live lease has a heap entry keyed at most
  its deadline; no ended lease has one. With ``expire_end``'s guard (no entry
  due) this gives **I4** for the real algorithm: after ``expire(now)`` no live
  lease has ``deadline <= now``, whatever the order of grants, renewals, ttls.
* ``L12`` tombstones: they name how the lease ended, are at most
  ``tombstone_capacity``, forgotten oldest first (no older one kept while a newer
  one is forgotten), and one is missing only after its ttl or an eviction.
* ``L13`` staging: entries only for ids neither live nor remembered, at most
  ``staging_capacity``, none older than ``staging_ttl`` after a reap.
* I2, I3, I10, I12 across ids, with re-grant as spec §6.1 defines it and staged
  notifications applied at the grant (§6.3); I13's verdict and its NK reason.
"""

from __future__ import annotations

from typing import Any

import z3

from .invariants import Invariant
from .model import ABORTED, ABSENT, EXPIRED, GRANTED, STATE_NAMES, TRANSFERRED, ended

__all__ = ["INVARIANTS", "SYSTEM"]
from .table_model import MAXT, N, count, g, pick

SYSTEM = "table"


def _all(f: Any) -> Any:
    return z3.And(*[f(k) for k in range(N)])


def _pairs(f: Any) -> Any:
    return z3.And(*[f(j, k) for j in range(N) for k in range(N) if j != k])


def _wf(s: Any, p: Any) -> Any:
    def one(k: int) -> Any:
        st = g(s, "st", k)
        return z3.And(
            st >= min(STATE_NAMES),
            st <= max(STATE_NAMES),
            z3.Implies(st == ABSENT, z3.And(g(s, "done", k) == 0, g(s, "rel", k) == 0)),
            z3.Implies(st != ABSENT, z3.And(g(s, "cons", k) >= 1, g(s, "done", k) >= 0)),
            z3.Implies(ended(st), z3.And(g(s, "eat", k) <= s.now, g(s, "eord", k) < s.ctr)),
        )

    return z3.And(
        z3.Or(s.phase == 0, s.phase == 1), s.swept <= s.now, s.ctr >= 0, s.sctr >= 0, _all(one)
    )


def _heap(s: Any, p: Any) -> Any:
    def one(k: int) -> Any:
        live = g(s, "st", k) == GRANTED
        return z3.And(
            z3.Implies(live, z3.And(g(s, "has", k), g(s, "key", k) <= g(s, "dl", k))),
            z3.Implies(z3.Not(live), z3.Not(g(s, "has", k))),
        )

    return _all(one)


def _i4(s: Any, p: Any) -> Any:
    return _all(lambda k: z3.Implies(g(s, "st", k) == GRANTED, g(s, "dl", k) > s.swept))


def _i3(s: Any, p: Any) -> Any:
    return _all(lambda k: g(s, "rel", k) == z3.If(ended(g(s, "st", k)), 1, 0))


def _i10(s: Any, p: Any) -> Any:
    def one(k: int) -> Any:
        st, done, rd = g(s, "st", k), g(s, "done", k), g(s, "rd", k)
        return z3.And(
            z3.Implies(st != ABSENT, rd >= 1),
            z3.Implies(st == GRANTED, done < rd),
            z3.Implies(st == TRANSFERRED, z3.And(done >= rd, done >= 1)),
        )

    return _all(one)


def _i12(s: Any, p: Any) -> Any:
    return _all(lambda k: z3.Implies(g(s, "st", k) == EXPIRED, g(s, "dl", k) <= g(s, "eat", k)))


def _ended2(s: Any, j: int, k: int) -> Any:
    return z3.And(ended(g(s, "st", j)), ended(g(s, "st", k)))


def _tomb_state(s: Any, p: Any) -> Any:
    """A tombstone names how its lease ended; ends are ordered in time."""

    def one(k: int) -> Any:
        return z3.Implies(
            g(s, "tomb", k), z3.And(ended(g(s, "st", k)), g(s, "tst", k) == g(s, "st", k))
        )

    def two(j: int, k: int) -> Any:
        both = _ended2(s, j, k)
        return z3.Implies(
            both,
            z3.And(
                g(s, "eord", j) != g(s, "eord", k),
                z3.Implies(g(s, "eord", j) < g(s, "eord", k), g(s, "eat", j) <= g(s, "eat", k)),
            ),
        )

    return z3.And(_all(one), _pairs(two))


def _tomb_oldest_first(s: Any, p: Any) -> Any:
    """No tombstone is kept while a newer one of an ended lease is forgotten."""

    def two(j: int, k: int) -> Any:
        return z3.Implies(
            z3.And(g(s, "tomb", j), ended(g(s, "st", k)), g(s, "eord", k) > g(s, "eord", j)),
            g(s, "tomb", k),
        )

    return _pairs(two)


def _tomb_capacity(s: Any, p: Any) -> Any:
    """Between calls at most ``tombstone_capacity`` tombstones."""
    return z3.Implies(s.phase == 0, count([g(s, "tomb", k) for k in range(N)]) <= p.Ct)


def _tomb_kept(s: Any, p: Any) -> Any:
    """An ended lease is forgotten only after its ttl (at a reap) or by an eviction."""

    def one(k: int) -> Any:
        return z3.Implies(
            z3.And(ended(g(s, "st", k)), z3.Not(g(s, "tomb", k))),
            z3.Or(g(s, "ev", k), g(s, "eat", k) + p.TT <= s.swept),
        )

    return _all(one)


def _staging(s: Any, p: Any) -> Any:
    def one(k: int) -> Any:
        return z3.Implies(
            g(s, "stg", k),
            z3.And(
                g(s, "st", k) != GRANTED,
                z3.Not(g(s, "tomb", k)),
                g(s, "str", k) >= 0,
                g(s, "str", k) <= MAXT,
                z3.Or(g(s, "sab", k), g(s, "str", k) >= 1),
                z3.Implies(g(s, "str", k) >= 1, g(s, "sn", k) >= 1),
                g(s, "sord", k) < s.sctr,
                g(s, "sfirst", k) <= s.now,
                g(s, "sfirst", k) + p.ST > s.swept,
            ),
        )

    def two(j: int, k: int) -> Any:
        both = z3.And(g(s, "stg", j), g(s, "stg", k))
        return z3.Implies(both, g(s, "sord", j) != g(s, "sord", k))

    cap = count([g(s, "stg", k) for k in range(N)]) <= p.Cs
    return z3.And(_all(one), _pairs(two), cap)


# -- step properties --------------------------------------------------------------------------
def _i2(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """Ended leases stay ended and nothing revives one; only a grant makes a new
    instance, of its own id."""

    def one(k: int) -> Any:
        st, st2 = g(s, "st", k), g(s2, "st", k)
        mine = a.i == k if t.name == "grant" else z3.BoolVal(False)
        return z3.Implies(
            z3.Not(mine),
            z3.And(
                z3.Implies(ended(st), z3.And(st2 == st, g(s2, "dl", k) == g(s, "dl", k))),
                z3.Implies(st2 == GRANTED, st == GRANTED),
                z3.Implies(st == ABSENT, st2 == ABSENT),
            ),
        )

    return _all(one)


def _regrant(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """A grant of an ended id forgets its tombstone and starts a new instance; a
    staged abort ends it at once ABORTED (spec §6.1, §6.3)."""
    if t.name != "grant":
        return z3.BoolVal(True)
    st2 = pick(a.i, s2, "st")
    return z3.And(
        z3.Not(pick(a.i, s2, "stg")),
        z3.Implies(pick(a.i, s2, "tomb"), z3.And(ended(st2), pick(a.i, s2, "eat") == a.t)),
        z3.Implies(z3.And(pick(a.i, s, "stg"), pick(a.i, s, "sab")), st2 == ABORTED),
        pick(a.i, s2, "dl") == a.t + a.ttl,
    )


def _staged_transfers(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """Staged transfer-dones count at the grant against the ``n`` the latest carried:
    they complete the lease exactly when there are at least that many."""
    if t.name != "grant":
        return z3.BoolVal(True)
    staged = z3.And(pick(a.i, s, "stg"), z3.Not(pick(a.i, s, "sab")))
    sn = pick(a.i, s, "sn")
    readers = z3.If(sn > 0, sn, a.cons)
    done = (pick(a.i, s2, "st") == TRANSFERRED) == (pick(a.i, s, "str") >= readers)
    return z3.Implies(staged, done)


def _i13(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """A transfer-done is answered OK exactly when the lease is live; after it
    ended, while P remembers it, NK names how it ended."""
    if not t.name.startswith("transfer_"):
        return z3.BoolVal(True)
    st = pick(a.i, s, "st")
    ok = out["ok"] == (st == GRANTED)
    if t.name == "transfer_late":
        return z3.And(ok, out["reason"] == st, ended(st))
    return ok


def _stages_only_unknown(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """A notification is staged only for an id neither live nor remembered, and
    the staged entry is new only when it evicts the oldest or there is room."""
    newly = [z3.And(g(s2, "stg", k), z3.Not(g(s, "stg", k))) for k in range(N)]
    if not t.name.endswith("_stage"):
        return z3.And(*[z3.Not(c) for c in newly])
    return z3.And(
        *[
            z3.Implies(c, z3.And(a.i == k, z3.Not(g(s, "tomb", k)), g(s, "st", k) != GRANTED))
            for k, c in enumerate(newly)
        ]
    )


def _progress(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    """Each pop of ``expire`` makes progress: it releases the popped lease (its
    entry leaves the heap) or requeues it once, at its later deadline. With
    finitely many entries the loop ends, and I4 holds when it does."""
    if t.name == "expire_release":
        return z3.Not(pick(a.i, s2, "has"))
    if t.name == "expire_requeue":
        key, key2 = pick(a.i, s, "key"), pick(a.i, s2, "key")
        return z3.And(key < key2, key2 == pick(a.i, s2, "dl"))
    return z3.BoolVal(True)


def _inv(iid: str, text: str, pred: Any, kind: str = "state") -> Invariant:
    return Invariant(iid, SYSTEM, kind, text, pred)


INVARIANTS: list[Invariant] = [
    _inv("L0", "well-formed table: states in range, end orders below the counter", _wf),
    _inv(
        "L11",
        "every live lease has a heap entry keyed at most its deadline; no ended one has "
        "(the B1 property: expire reaches every due lease)",
        _heap,
    ),
    _inv("I4", "After expire(now), no live lease has deadline <= now.", _i4),
    _inv("I3", "every lease instance is released exactly once", _i3),
    _inv("I10", "a live lease has counted fewer transfer-dones than its readers", _i10),
    _inv("I12", "EXPIRED => deadline <= ended_at", _i12),
    _inv("L12", "a tombstone names how its lease ended; ends ordered in time", _tomb_state),
    _inv("L12", "tombstones are forgotten oldest first", _tomb_oldest_first),
    _inv("L12", "at most tombstone_capacity tombstones between calls", _tomb_capacity),
    _inv("L12", "an ended lease is forgotten only after tombstone_ttl or an eviction", _tomb_kept),
    _inv("L13", "staged entries: unknown ids only, within capacity and staging_ttl", _staging),
    _inv(
        "I4",
        "expire(now) returns: each pop releases its lease or requeues it once at its deadline",
        _progress,
        "step",
    ),
    _inv("I2", "ended leases stay ended; only a grant starts a new instance", _i2, "step"),
    _inv(
        "I2",
        "re-grant forgets the tombstone, a staged abort ends the new lease",
        _regrant,
        "step",
    ),
    _inv(
        "I10",
        "staged transfer-dones complete the lease at the grant iff they reach its readers",
        _staged_transfers,
        "step",
    ),
    _inv(
        "I13",
        "a transfer-done is answered OK iff live; NK names how it ended",
        _i13,
        "step",
    ),
    _inv("L13", "only unknown ids are staged", _stages_only_unknown, "step"),
]
