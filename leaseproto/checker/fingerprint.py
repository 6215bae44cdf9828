"""Canonical fingerprints of checker states.

Two states with the same fingerprint behave alike from then on, so the search
keeps one. Every time is taken relative to ``now`` (the core only ever compares
times, so shifting all of them changes nothing) and clamped to ``±horizon``,
beyond which no duration of the configuration reaches; counters kept only for
statistics are left out. The heap is listed in pop order with each entry's
liveness, because stale entries and tie order change what ``expire`` returns.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.clock import ClockOffset
    from ..core.push import PushRegistrations
    from ..core.table import LeaseTable
    from ..core.tracker import HeartbeatTracker

__all__ = ["registrations_fp", "world_fingerprint"]

#: a :class:`~.world.World` (not imported: the world imports this module)
World_ = Any


def _horizon(w: World_) -> float:
    c = w.cfg
    spans = [w.ttl, c.lease_extension, c.tombstone_ttl, c.staging_ttl]
    if c.max_lease_lifetime is not None:
        spans.append(c.max_lease_lifetime)
    return float(max(spans) + w.scope.delay + 2)


def _rel(t: float | None, now: float, h: float) -> float | None:
    if t is None or not math.isfinite(t):
        return t
    return max(-h, min(h, t - now))


def table_fp(t: LeaseTable, now: float, h: float) -> tuple[Any, ...]:
    leases = t._leases
    cap = t.config.max_lease_lifetime
    live = tuple(
        (
            rid,
            lease.state,
            _rel(lease.deadline, now, h),
            _rel(None if cap is None else lease.granted_at + cap, now, h),
            lease.consumers,
            getattr(lease, "readers", None),
            lease.done,
        )
        for rid, lease in leases.items()
    )
    heap = tuple(
        (_rel(d, now, h), lease.req_id, leases.get(lease.req_id) is lease)
        for d, lease in t._queue.entries()
    )
    ended = tuple((rid, st, _rel(at, now, h)) for rid, (st, at) in t._ended.items())
    staged = tuple((rid, _rel(e[0], now, h), *e[1:]) for rid, e in t._staged.items())
    # the stale count decides when the table compacts (scopes with a compaction slack)
    return live, heap, ended, staged, _rel(t._last_now, now, h), t._queue.stale


def tracker_fp(t: HeartbeatTracker, now: float, h: float) -> tuple[Any, ...]:
    v = vars(t)
    by_engine = tuple((e, tuple(reqs.items())) for e, reqs in v["_by_engine"].items())
    # which local request names which remote id of which engine, in tracking order
    engine_of = tuple((rid, reqs.engine, remote) for rid, (reqs, remote) in v["_engine_of"].items())
    last = tuple((e, _rel(x, now, h)) for e, x in v["_last_sent"].items())
    order = v.get("_order", {})
    ranks = tuple(sorted(order, key=order.__getitem__))  # the counter behind it only grows
    timers = tuple((k, _rel(v[k], now, h)) for k in ("_oldest", "_next_at", "_last_now") if k in v)
    return by_engine, engine_of, last, tuple(v.get("_unsent", ())), ranks, timers


def clock_fp(c: ClockOffset, w: World_, h: float) -> tuple[Any, ...]:
    """The kept sample (the count of samples is only a statistic), shift-free: its
    error (the true offset at the sample's ``t0`` minus the estimate), its
    uncertainty and its age on D's clock. With drift the true offset moves with
    ``now``, the error at ``t0`` does not. The age is clamped where it stops
    mattering: past ``h`` without ageing, and with ageing faster than the true
    drift past the age at which the aged uncertainty exceeds every span a
    deadline can lie ahead (the gate then refuses every read)."""
    if not c.has_sample:
        return (None,)
    k, t0 = w.scope.d_rate, c.sampled_at
    err = t0 / k + w.scope.skew - t0 - c.offset
    ageing = 2 * c.rho / (1 - c.rho)
    drift = abs(1 - k) / k
    top = max(h, h / (ageing - drift)) if ageing > drift else h
    return round(err, 9), c.uncertainty, min(w.d_clock(w.now) - t0, top)


def registrations_fp(g: PushRegistrations) -> tuple[Any, ...]:
    """A grantor rank's push registrations (no times in them), and the blocks it
    has yet to hand back."""
    regs = tuple((r, tuple(sorted(e.owed)), e.failed, e.ended) for r, e in sorted(g._regs.items()))
    return regs, tuple(g._free)


def world_fingerprint(w: World_) -> bytes:
    now = float(w.now)
    h = _horizon(w)
    ghosts = (
        tuple(
            (
                k,
                tuple(
                    (
                        i.live,
                        i.reason,
                        _rel(i.ended_at, now, h),
                        i.tds,
                        _rel(i.granted_at, now, h) if i.live else None,
                        _rel(i.renewed_at, now, h) if i.live else None,
                    )
                    for i in v
                ),
            )
            for k, v in sorted(w.inst.items())
        ),
        tuple(sorted(w.staged.items())),
        tuple(sorted(w.staged_abort)),
        tuple(sorted(w.staged_mark.items())),
        tuple(
            (p, tuple((r, x, _rel(at, now, h)) for r, (x, at) in tb.items()))
            for p, tb in w.tombs.items()
        ),
        tuple(sorted((r, _rel(at, now, h)) for r, at in w.first_grant.items())),
        tuple(sorted(w.phase.items())),
        tuple(sorted(w.reads.items())),
        tuple(sorted((k, tuple(sorted(v))) for k, v in w.due.items())),
        tuple((p, clock_fp(c, w, h)) for p, c in sorted(w.clocks.items())),
        tuple((p, _rel(t, now, h)) for p, t in sorted(w.hello.items())),
        # the router's give-ups (scope ``router``; empty elsewhere)
        tuple(
            sorted((r, _rel(at, now, h), tuple(sorted(ex))) for r, (at, ex) in w.gave_up.items())
        ),
        tuple((k, tuple(v)) for k, v in sorted(w.ctl.items()) if v),
        tuple(sorted(w.cancelled)),
        tuple(sorted(w.routed)),
    )
    state = (
        tuple(table_fp(w.tables[p], now, h) for p in w.P),
        tracker_fp(w.tracker, w.reader_now(), h),
        tuple(sorted((m.src, m.dst, m.data, _rel(m.sent, now, h)) for m in w.net)),
        tuple(sorted((m.src, m.dst, m.data, _rel(m.sent, now, h)) for m in w.undecided)),
        tuple((k, tuple((m.src, m.data) for m in v)) for k, v in sorted(w.inbox.items()) if v),
        tuple(sorted((k, tuple(sorted(v))) for k, v in w.granted_now.items())),
        tuple(sorted((e, _rel(t, w.reader_now(), h)) for e, t in w.last_hb.items())),
        tuple(sorted(w.budget.items())),
        w.turn,
        w.d_received,
        w.d_alive,
        _rel(w.paused_until, now, h) if w.paused() else None,
        tuple(sorted(w.pending)),
        w.broken,
        ghosts,
        w.extra_fingerprint(),
    )
    return hashlib.blake2b(repr(state).encode(), digest_size=16).digest()
