"""P's whole lease table as a z3 system: ``N`` request ids, the heap with lazy
requeue, tombstones and staging (spec §6.3, §8.1-§8.5; what it proves:
:mod:`proofs.table_invariants`).

The per-lease models (:mod:`proofs.model`) see one lease at a time; what
:class:`~leaseproto.LeaseTable` relies on lies between leases: ``expire`` pops
heap entries in key order and stops at the first key past ``now``, so a live
lease whose entry is missing or keyed after its deadline is never released
(upstream B1). Here every id ``k`` in ``0..N-1`` has the fields of its current
lease (``st``, ``dl`` the deadline, ``cons``, ``rd`` readers, ``done``), of its
heap entry (``has``: the table's heap holds an entry for *this* lease,
``key``: its key), of its tombstone (``tomb``, ``tst`` the state recorded,
``eat`` ended at, ``eord`` its place in end order) and of its staged
notifications (``stg``, ``sfirst``, ``str`` transfer-dones, ``sab`` abort,
``sn`` the latest ``n``, ``sord`` its place in staging order); ghosts ``rel``
(releases of the current instance) and ``ev`` (its tombstone was evicted for
capacity). Globals: ``now``, ``swept`` (the ``now`` of the last completed
``expire``), ``phase`` (1 while one ``expire`` call runs), ``ctr``/``sctr``
(the next end / staging order).

Each call is a transition over a symbolic id ``i``, with its branch as in the
runtime (``transfer_live`` / ``transfer_late`` / ``transfer_stage`` follow the
``if`` of ``LeaseTable.transfer_done``). ``expire`` is the runtime's loop, one
heap pop per transition: ``expire_begin``, then ``expire_requeue`` (the popped
minimum was renewed since it was queued: pushed back at its deadline, even when
that is due too) or ``expire_release`` (its key is its deadline: the rule
decides), and ``expire_end`` once no entry is due (the batch's tombstone trim,
then the TTL pruning of ``_prune``). ``peek_requeue`` is ``next_deadline``'s
requeue. Every state change is computed by :mod:`leaseproto.core.rules` on z3
terms, read from the module when the model is built. Entries of ended leases
(stale, skipped by identity in ``expire``, dropped by ``_compact``) are not
modelled: they change nothing a caller can see.

Bounded by construction: ``N`` ids, at most :data:`MAXT` staged transfer-dones
per id (a grant applies them in a loop unrolled that far). Everything else
(times, ttls, capacities, counts) is unbounded. ``tests/test_refinement.py``
checks the runtime's queue, tombstones and staging against this model call by
call. The runtime keeps these entries in a calendar (``core/deadlines.py``: one
bucket per distinct key, buckets in a heap, ties in grant order); the model's
heap is the same set of ``(key, lease)`` entries with ties taken in any order,
so what is proved here holds for every tie order, the runtime's included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from leaseproto.core import rules as R
from leaseproto.core.state import Input
from leaseproto.core.sym import conj, disj, ite, neg

from .kit import Int, Real, System, Transition
from .model import ABORTED, ABSENT, EXPIRED, GRANTED, TRANSFERRED
from .table_parts import (
    GLOBAL,
    MAXT,
    PARAMS,
    PER_ID,
    Draft,
    N,
    allowed,
    count,
    end_lease,
    ended,
    g,
    heap_min,
    implies,
    pick,
    requeue_key,
    stage,
    trim,
)

__all__ = ["MAXT", "N", "count", "g", "pick", "table_system"]


# -- the system -------------------------------------------------------------------------------
def table_system() -> System:
    fields = {f"{n}{k}": sort for k in range(N) for n, sort in PER_ID.items()}
    fields.update(GLOBAL)

    def axioms(p: Any) -> Any:
        return conj(p.E > 0, p.Ct >= 1, p.Cs >= 0, p.TT > 0, p.ST > 0)

    def init(s: Any, p: Any) -> Any:
        per = [
            conj(
                g(s, "st", k) == ABSENT,
                neg(g(s, "has", k)),
                g(s, "done", k) == 0,
                g(s, "rel", k) == 0,
                neg(g(s, "tomb", k)),
                neg(g(s, "ev", k)),
                neg(g(s, "stg", k)),
            )
            for k in range(N)
        ]
        return conj(*per, s.phase == 0, s.ctr == 0, s.sctr == 0, s.swept <= s.now)

    def idle(s: Any, a: Any) -> Any:
        return conj(s.phase == 0, a.t >= s.now, a.i >= 0, a.i < N)

    def at(s: Any, a: Any) -> Draft:
        d = Draft(s)
        d.set(True, "now", None, a.t)
        return d

    # grant (§8.1): a re-grant forgets the tombstone, the id is ABSENT again (REGRANT)
    def st0(s: Any, i: Any) -> Any:
        st = pick(i, s, "st")
        return ite(ended(st), ABSENT, st)

    def grant_guard(s: Any, a: Any, p: Any) -> Any:
        return conj(idle(s, a), allowed(st0(s, a.i), Input.GRANT), a.ttl > 0, a.cons >= 1)

    def grant_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = at(s, a)
        ends, states = [], []
        for k in range(N):
            c = a.i == k
            if c is False:  # on numbers: not this id (GRANTED has no grant row to look up)
                ends.append(False)
                states.append(ABSENT)
                continue
            st = R.next_state(ite(ended(g(s, "st", k)), ABSENT, g(s, "st", k)), Input.GRANT, True)
            dl = R.grant_deadline(a.t, a.ttl)
            for name, v in (
                ("st", st),
                ("dl", dl),
                ("key", dl),
                ("has", True),
                ("cons", a.cons),
                ("rd", a.cons),
                ("done", 0),
                ("rel", 0),
                ("tomb", False),
                ("ev", False),
                ("stg", False),
            ):
                d.set(c, name, k, v)
            staged = g(s, "stg", k)
            aborted = conj(staged, g(s, "sab", k))
            rd = ite(g(s, "sn", k) > 0, g(s, "sn", k), a.cons)
            run = conj(staged, neg(g(s, "sab", k)))
            d.set(conj(c, run), "rd", k, rd)
            done: Any = 0
            state = st
            for j in range(MAXT):  # for _ in range(transfers): ... if it ended: stop
                active = conj(run, j < g(s, "str", k), state == GRANTED)
                nxt = R.transfer_done_state(state, done, rd)
                done = ite(active, R.transfer_done_count(state, done), done)
                state = ite(active, nxt, state)
            d.set(c, "done", k, done)
            final = ite(aborted, R.abort_state(st), state)
            ends.append(conj(c, final != GRANTED))
            states.append(final)
        end_lease(d, ends, states, a.t)
        trim(d, p)
        return d.v

    def renew_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = at(s, a)
        for k in range(N):
            st, dl = g(s, "st", k), g(s, "dl", k)
            applies, dl2 = R.renew_rule(st, dl, None, a.t, p.E)
            d.set(a.i == k, "st", k, R.next_state(st, Input.RECV_HEARTBEAT, applies))
            d.set(a.i == k, "dl", k, dl2)
        return d.v

    def live(s: Any, a: Any) -> Any:
        return pick(a.i, s, "st") == GRANTED

    def late(s: Any, a: Any) -> Any:
        return conj(neg(live(s, a)), pick(a.i, s, "tomb"))

    def unknown(s: Any, a: Any) -> Any:
        return conj(neg(live(s, a)), neg(pick(a.i, s, "tomb")))

    def transfer_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = at(s, a)
        ends, states = [], []
        for k in range(N):
            st, done = g(s, "st", k), g(s, "done", k)
            c = a.i == k
            st2 = R.transfer_done_state(st, done, a.n)
            d.set(c, "done", k, R.transfer_done_count(st, done))
            d.set(conj(c, st == GRANTED), "rd", k, a.n)
            ends.append(conj(c, st == GRANTED, st2 != GRANTED))
            states.append(st2)
            d.set(c, "st", k, st2)
        end_lease(d, ends, states, a.t)
        trim(d, p)
        return d.v

    def abort_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = at(s, a)
        ends, states = [], []
        for k in range(N):
            st = g(s, "st", k)
            st2 = R.abort_state(st)
            ends.append(conj(a.i == k, st == GRANTED, st2 != GRANTED))
            states.append(st2)
            d.set(a.i == k, "st", k, st2)
        end_lease(d, ends, states, a.t)
        trim(d, p)
        return d.v

    def stage_upd(abort: bool) -> Callable[[Any, Any, Any], dict[str, Any]]:
        def upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
            d = at(s, a)
            stage(d, a.i, a.t, p, abort=abort, n=None if abort else a.n)
            return d.v

        return upd

    def verdict(s: Any, a: Any, p: Any) -> dict[str, Any]:
        return {"ok": R.transfer_verdict_ok(pick(a.i, s, "st")), "reason": pick(a.i, s, "tst")}

    # expire (§8.5), one heap pop per transition
    def popping(s: Any, a: Any) -> Any:
        return conj(s.phase == 1, a.i >= 0, a.i < N, heap_min(s, a.i), pick(a.i, s, "key") <= s.now)

    def requeue_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = Draft(s)
        for k in range(N):
            d.set(a.i == k, "key", k, requeue_key(g(s, "dl", k)))
        return d.v

    def release_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = Draft(s)
        ends, states = [], []
        for k in range(N):
            st2 = R.expire_state(g(s, "st", k), g(s, "dl", k), s.now)
            ends.append(conj(a.i == k, st2 != GRANTED))
            states.append(st2)
        end_lease(d, ends, states, s.now)  # trimmed once, at expire_end
        return d.v

    def end_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        d = Draft(s)
        d.set(True, "phase", None, 0)
        d.set(True, "swept", None, s.now)
        trim(d, p)
        for k in range(N):  # _prune: tombstones, then staged entries, past their ttl
            d.set(True, "tomb", k, conj(d["tomb", k], g(s, "eat", k) + p.TT > s.now))
            d.set(True, "stg", k, conj(g(s, "stg", k), g(s, "sfirst", k) + p.ST > s.now))
        return d.v

    def nothing_due(s: Any) -> Any:
        return conj(*[implies(g(s, "has", k), g(s, "key", k) > s.now) for k in range(N)])

    ti = {"t": Real, "i": Int}
    tn = {"t": Real, "i": Int, "n": Int}
    only_i = {"i": Int}
    transitions = [
        Transition(
            "grant",
            "grant(id, now=t, ttl, consumers), applying what was staged",
            {"t": Real, "i": Int, "ttl": Real, "cons": Int},
            grant_guard,
            grant_upd,
            witness=lambda s, s2, a, p: conj(
                ended(pick(a.i, s, "st")),
                pick(a.i, s, "stg"),
                pick(a.i, s, "str") >= 1,
                pick(a.i, s2, "st") == GRANTED,
                pick(a.i, s2, "done") >= 1,
            ),
        ),
        Transition(
            "renew",
            "a heartbeat naming id: renew([id], now=t)",
            ti,
            lambda s, a, p: idle(s, a),
            renew_upd,
            witness=lambda s, s2, a, p: conj(live(s, a), pick(a.i, s2, "dl") > pick(a.i, s, "dl")),
        ),
        Transition(
            "transfer_live",
            "transfer_done(id, now=t, readers=n) for a live lease",
            tn,
            lambda s, a, p: conj(idle(s, a), a.n >= 1, live(s, a)),
            transfer_upd,
            witness=lambda s, s2, a, p: conj(a.n > 1, pick(a.i, s2, "st") == TRANSFERRED),
            outputs=verdict,
        ),
        Transition(
            "transfer_late",
            "transfer_done(id, ...) for an ended lease P remembers",
            tn,
            lambda s, a, p: conj(idle(s, a), a.n >= 1, late(s, a)),
            transfer_upd,
            witness=lambda s, s2, a, p: pick(a.i, s, "st") == EXPIRED,
            outputs=verdict,
        ),
        Transition(
            "transfer_stage",
            "transfer_done(id, ...) for an id P knows nothing of: staged",
            tn,
            lambda s, a, p: conj(
                idle(s, a),
                a.n >= 1,
                unknown(s, a),
                implies(pick(a.i, s, "stg"), pick(a.i, s, "str") < MAXT),
            ),
            stage_upd(abort=False),
            witness=lambda s, s2, a, p: conj(
                ended(pick(a.i, s, "st")),
                neg(pick(a.i, s, "stg")),
                count([g(s, "stg", k) for k in range(N)]) == p.Cs,
                count([g(s2, "stg", k) for k in range(N)]) == p.Cs,
                p.Cs >= 1,
            ),
            outputs=verdict,
        ),
        Transition(
            "abort_live",
            "abort(id, now=t) of a live lease",
            ti,
            lambda s, a, p: conj(idle(s, a), live(s, a)),
            abort_upd,
            witness=lambda s, s2, a, p: conj(
                pick(a.i, s2, "st") == ABORTED,
                count([g(s, "tomb", k) for k in range(N)]) == p.Ct,
                count([g(s2, "tomb", k) for k in range(N)]) == p.Ct,
            ),
        ),
        Transition(
            "abort_late",
            "abort(id, ...) of an ended lease P remembers",
            ti,
            lambda s, a, p: conj(idle(s, a), late(s, a)),
            abort_upd,
            witness=lambda s, s2, a, p: pick(a.i, s, "st") == TRANSFERRED,
        ),
        Transition(
            "abort_stage",
            "abort(id, ...) for an id P knows nothing of: staged",
            ti,
            lambda s, a, p: conj(idle(s, a), unknown(s, a)),
            stage_upd(abort=True),
            witness=lambda s, s2, a, p: conj(pick(a.i, s2, "sab"), pick(a.i, s, "stg")),
        ),
        Transition(
            "expire_begin",
            "expire(now=t) starts",
            {"t": Real},
            lambda s, a, p: conj(s.phase == 0, a.t >= s.now),
            lambda s, a, p: {"phase": 1, "now": a.t},
            witness=lambda s, s2, a, p: disj(
                *[conj(g(s, "st", k) == GRANTED, g(s, "dl", k) <= a.t) for k in range(N)]
            ),
        ),
        Transition(
            "expire_requeue",
            "expire pops an entry renewed since queued: pushed back at its deadline",
            only_i,
            lambda s, a, p: conj(popping(s, a), pick(a.i, s, "key") != pick(a.i, s, "dl")),
            requeue_upd,
            witness=lambda s, s2, a, p: pick(a.i, s, "dl") <= s.now,
        ),
        Transition(
            "expire_release",
            "expire pops an entry keyed at its lease's deadline: the rule decides",
            only_i,
            lambda s, a, p: conj(popping(s, a), pick(a.i, s, "key") == pick(a.i, s, "dl")),
            release_upd,
            witness=lambda s, s2, a, p: pick(a.i, s2, "st") == EXPIRED,
        ),
        Transition(
            "expire_end",
            "expire stops: no entry due; trims tombstones, prunes both by ttl",
            {},
            lambda s, a, p: conj(s.phase == 1, nothing_due(s)),
            end_upd,
            witness=lambda s, s2, a, p: conj(
                count([g(s, "tomb", k) for k in range(N)]) > p.Ct,
                disj(*[conj(g(s, "stg", k), neg(g(s2, "stg", k))) for k in range(N)]),
            ),
        ),
        Transition(
            "peek_requeue",
            "next_deadline() requeues a renewed minimum",
            only_i,
            lambda s, a, p: conj(
                s.phase == 0,
                a.i >= 0,
                a.i < N,
                heap_min(s, a.i),
                pick(a.i, s, "key") != pick(a.i, s, "dl"),
            ),
            requeue_upd,
            witness=lambda s, s2, a, p: pick(a.i, s, "key") < pick(a.i, s, "dl"),
        ),
    ]
    return System(
        "table",
        f"P's lease table: {N} ids, heap with lazy requeue, tombstones, staging",
        fields,
        dict(PARAMS),
        axioms,
        init,
        transitions,
    )
