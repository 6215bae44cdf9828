"""The pieces of :mod:`proofs.table_model`: the fields of one id and the
globals, the helpers that read them (heap minimum, tombstone and staging
order), and the building blocks of its transitions (ending a lease, the
tombstone trim, staging a notification). Written here so the system itself,
``table_system``, reads as the list of the runtime's calls."""

from __future__ import annotations

from typing import Any

from leaseproto.core.state import ENDED_STATES, TRANSITIONS, Input
from leaseproto.core.sym import conj, disj, ite, neg

from .kit import Bool, Int, Real, Values

N = 3
#: staged transfer-dones the model counts per id (the grant's loop is unrolled this far)
MAXT = 3

PER_ID = {
    "st": Int,
    "dl": Real,
    "key": Real,
    "has": Bool,
    "cons": Int,
    "rd": Int,
    "done": Int,
    "rel": Int,
    "tomb": Bool,
    "tst": Int,
    "eat": Real,
    "eord": Int,
    "ev": Bool,
    "stg": Bool,
    "sfirst": Real,
    "str": Int,
    "sab": Bool,
    "sn": Int,
    "sord": Int,
}
GLOBAL = {"now": Real, "swept": Real, "phase": Int, "ctr": Int, "sctr": Int}
PARAMS = {"E": Real, "Ct": Int, "Cs": Int, "TT": Real, "ST": Real}


def ended(st: Any) -> Any:
    """``st`` is an ended state (on numbers or z3 terms)."""
    return disj(*[st == int(x) for x in sorted(ENDED_STATES)])


def allowed(st: Any, inp: Input) -> Any:
    """``(st, inp)`` has a row in :data:`TRANSITIONS`."""
    return disj(*[st == int(src) for (src, i) in TRANSITIONS if i is inp])


def implies(a: Any, b: Any) -> Any:
    return disj(neg(a), b)


def g(s: Any, name: str, k: int) -> Any:
    """Field ``name`` of id ``k``."""
    return s[f"{name}{k}"]


def count(conds: list[Any]) -> Any:
    return sum(ite(c, 1, 0) for c in conds)


# -- the algorithm's pieces (module level, so a test can break one in memory) ----------------
def requeue_key(deadline: Any) -> Any:
    """The key a popped, renewed entry is pushed back with: its lease's deadline."""
    return deadline


def tomb_kept(s: Any, k: int, cap: Any) -> Any:
    """Trimming to capacity forgets the oldest first: tombstone ``k`` stays when
    fewer than ``cap`` tombstones are newer (``while len > cap: popitem(last=False)``)."""
    newer = [conj(g(s, "tomb", j), g(s, "eord", j) > g(s, "eord", k)) for j in range(N) if j != k]
    return conj(g(s, "tomb", k), count(newer) < cap)


def staged_oldest(s: Any, k: int) -> Any:
    """``k`` is the oldest staged id (dropped first when staging is full)."""
    older = [implies(g(s, "stg", j), g(s, "sord", k) < g(s, "sord", j)) for j in range(N) if j != k]
    return conj(g(s, "stg", k), *older)


def heap_min(s: Any, i: Any) -> Any:
    """The entry of id ``i`` is a minimum of the heap (ties in any order)."""
    return conj(
        *[
            implies(
                i == k,
                conj(
                    g(s, "has", k),
                    *[
                        implies(g(s, "has", j), g(s, "key", k) <= g(s, "key", j))
                        for j in range(N)
                        if j != k
                    ],
                ),
            )
            for k in range(N)
        ]
    )


def pick(i: Any, s: Any, name: str) -> Any:
    """Field ``name`` of the symbolic id ``i``."""
    out = g(s, name, N - 1)
    for k in range(N - 2, -1, -1):
        out = ite(i == k, g(s, name, k), out)
    return out


class Draft:
    """The post-state being built: per-id and global values, starting from ``s``."""

    def __init__(self, s: Any) -> None:
        self.v: dict[str, Any] = {n: s[n] for n in s.names()}

    def __getitem__(self, key: tuple[str, int] | str) -> Any:
        return self.v[key if isinstance(key, str) else f"{key[0]}{key[1]}"]

    def set(self, cond: Any, name: str, k: int | None, value: Any) -> None:
        f = name if k is None else f"{name}{k}"
        self.v[f] = ite(cond, value, self.v[f])

    def view(self) -> Values:
        return Values(self.v)


def end_lease(d: Draft, conds: list[Any], state: list[Any], t: Any) -> None:
    """``_end``: lease ``k`` (where ``conds[k]``) ends in ``state[k]`` at ``t``;
    its tombstone is the newest. At most one ``conds[k]`` holds."""
    ctr = d["ctr"]
    for k in range(N):
        c = conds[k]
        d.set(c, "st", k, state[k])
        d.set(c, "has", k, False)
        d.set(c, "rel", k, d["rel", k] + 1)
        d.set(c, "tomb", k, True)
        d.set(c, "tst", k, state[k])
        d.set(c, "eat", k, t)
        d.set(c, "eord", k, ctr)
        d.set(c, "ev", k, False)
    d.set(disj(*conds), "ctr", None, ctr + 1)


def trim(d: Draft, p: Any) -> None:
    s = d.view()
    kept = [tomb_kept(s, k, p.Ct) for k in range(N)]
    for k in range(N):
        d.set(True, "ev", k, disj(g(s, "ev", k), conj(g(s, "tomb", k), neg(kept[k]))))
        d.set(True, "tomb", k, kept[k])


def stage(d: Draft, i: Any, t: Any, p: Any, *, abort: bool, n: Any = None) -> None:
    """``_stage``: create the entry (dropping the oldest when full), then add."""
    s = d.view()
    full = count([g(s, "stg", k) for k in range(N)]) >= p.Cs
    new = neg(pick(i, s, "stg"))
    keep = disj(neg(new), p.Cs > 0)  # staging_capacity 0: dropped
    for k in range(N):
        c = conj(i == k, keep)
        d.set(conj(new, keep, full, staged_oldest(s, k)), "stg", k, False)
        fresh = conj(c, new)
        d.set(fresh, "stg", k, True)
        d.set(fresh, "sfirst", k, t)
        d.set(fresh, "str", k, 0)
        d.set(fresh, "sab", k, False)
        d.set(fresh, "sn", k, 0)
        d.set(fresh, "sord", k, s.sctr)
        if abort:
            d.set(c, "sab", k, True)
        else:
            d.set(c, "str", k, d["str", k] + 1)
            d.set(c, "sn", k, n)
    d.set(conj(new, keep), "sctr", None, s.sctr + 1)
