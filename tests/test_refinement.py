"""Refinement: random concrete runs of the runtime satisfy the z3 transition
relations of proofs/ step by step.

LeaseTable and HeartbeatTracker are driven through their public API; their
state is read back (``lease_info``, ``ended``, returned ``Release`` s, ``due``'s
output) and, with the pre-state, substituted into the relation of the matching
transition of ``leaseproto.proofs.model`` (``lease``/``lease-cap`` per lease, ``engine``
per P engine). The relation must simplify to true. Fields the runtime does not
expose (a ttl, the count of an ended lease) are taken from the model's own
update, so only what is observable is checked. Times and durations are
multiples of 1/4, so float arithmetic in the runtime is exact and equals the
model's rational arithmetic.

The per-lease models have no staging, so the LeaseTable run here has it off;
tests/test_refinement_table.py checks the whole table (heap, tombstones and
staging on at small capacities, two P engines) against the table system, and
that the seeded bugs fail it.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest
import z3
from hypothesis import given
from hypothesis import strategies as st
from leaseproto.proofs import model
from leaseproto.proofs.kit import Values, from_z3, to_z3

from leaseproto import ClockOffset, HeartbeatTracker, LeaseConfig, LeaseTable, LocalProtocolError
from leaseproto.core import rules as R
from leaseproto.core.events import Release, ReleaseReason

IDS = ("a", "b", "c")
STATE_OF = {
    ReleaseReason.TRANSFERRED: model.TRANSFERRED,
    ReleaseReason.EXPIRED: model.EXPIRED,
    ReleaseReason.ABORTED: model.ABORTED,
}
quarter = st.integers(0, 12).map(lambda k: k / 4)


def zvals(values: dict[str, Any], sorts: dict[str, Any]) -> Values:
    return Values({k: to_z3(v, sorts[k]) for k, v in values.items()})


def check_step(
    sys_: Any,
    tname: str,
    pre: dict[str, Any],
    observed: dict[str, Any],
    *,
    args: dict[str, Any],
    params: dict[str, Any],
) -> dict[str, Any]:
    """Complete ``observed`` with the model's update for the unobservable fields,
    assert the relation holds on (pre, post), and return post."""
    t = sys_.transition(tname)
    s, a = zvals(pre, sys_.fields), zvals(args, t.args)
    p = zvals(params, sys_.params)
    upd = t.update(s, a, p)
    post = {f: observed[f] if f in observed else from_z3(upd.get(f, s[f])) for f in sys_.fields}
    rel = z3.simplify(sys_.relation(t, s, zvals(post, sys_.fields), a, p))
    if not z3.is_true(rel):
        wrong = {f: (post[f], from_z3(upd[f])) for f in upd if from_z3(upd[f]) != post[f]}
        guard = from_z3(t.guard(s, a, p))
        pytest.fail(
            f"{sys_.name}.{tname} relation false: guard={guard}, "
            f"runtime vs model {wrong}\npre={pre}\nargs={args}"
        )
    return post


# -- LeaseTable ---------------------------------------------------------------------------
def fresh(now: float) -> dict[str, Any]:
    return {
        "st": model.ABSENT,
        "now": now,
        "granted_at": 0,
        "ttl": 0,
        "deadline": 0,
        "cap_at": 0,
        "consumers": 0,
        "readers": 0,
        "done": 0,
        "lr": 0,
        "has_lr": False,
        "grants": 0,
        "released": 0,
        "swept": now,
        "ended_at": 0,
    }


def observe(
    table: LeaseTable,
    rid: str,
    pre: dict[str, Any],
    *,
    now: float,
    released: Release | None,
    swept: bool,
) -> dict[str, Any]:
    """What the runtime exposes about lease ``rid`` after a call at ``now``."""
    obs: dict[str, Any] = {"now": now, "released": pre["released"] + (released is not None)}
    if swept:
        obs["swept"] = now
    info = table.lease_info(rid)
    if info is not None:
        obs["st"] = model.GRANTED
        for key in ("granted_at", "deadline", "cap_at", "consumers", "readers", "done"):
            if info[key] is not None:
                obs[key] = info[key]
        obs["has_lr"] = info["last_renewal"] is not None
        if info["last_renewal"] is not None:
            obs["lr"] = info["last_renewal"]
        return obs
    reason = table.ended(rid)
    obs["st"] = model.ABSENT if reason is None else STATE_OF[reason]
    if released is not None:
        obs.update(
            ended_at=released.at,
            deadline=released.deadline,
            granted_at=released.granted_at,
            has_lr=released.last_renewal is not None,
        )
        if released.last_renewal is not None:
            obs["lr"] = released.last_renewal
    return obs


op = st.one_of(
    st.tuples(
        st.just("grant"),
        st.sampled_from(IDS),
        quarter,
        st.sampled_from([None, 0.5, 2.0, 20.0]),
        st.integers(1, 3),
    ),
    st.tuples(st.just("renew"), st.lists(st.sampled_from(IDS), max_size=4), quarter),
    st.tuples(
        st.just("transfer_done"), st.sampled_from(IDS), st.none() | st.integers(1, 3), quarter
    ),
    st.tuples(st.just("abort"), st.sampled_from(IDS), quarter),
    st.tuples(st.just("expire"), quarter),
)


@given(cap=st.booleans(), ops=st.lists(op, max_size=30))
def test_lease_table_refines_the_lease_model(cap: bool, ops: list[tuple[Any, ...]]) -> None:
    cfg = LeaseConfig(
        kv_lease_duration=8,
        heartbeat_interval=1,
        lease_extension=4,
        max_lease_lifetime=12 if cap else None,
        staging_capacity=0,
        tombstone_ttl=10_000,
    )
    sys_ = model.lease_system(cap=cap)
    params = {"E": cfg.lease_extension, **({"C": cfg.max_lease_lifetime} if cap else {})}
    table = LeaseTable(cfg)
    now = 0.0
    state = {rid: fresh(now) for rid in IDS}
    for kind, *rest in ops:
        now += rest[-1] if kind != "grant" else rest[1]
        released: dict[str, Release] = {}
        steps = dict.fromkeys(IDS, "advance")
        args: dict[str, dict[str, Any]] = {rid: {"t": now} for rid in IDS}
        if kind == "grant":
            rid, _, ttl, consumers = rest
            if rid in table:
                with pytest.raises(LocalProtocolError):
                    table.grant(rid, now=now, consumers=consumers, ttl=ttl)
                guard = sys_.transition("grant").guard(
                    zvals(state[rid], sys_.fields),
                    zvals(
                        {"t": now, "ttl": 1, "consumers": 1},
                        {"t": z3.RealSort(), "ttl": z3.RealSort(), "consumers": z3.IntSort()},
                    ),
                    zvals(params, sys_.params),
                )
                assert z3.is_false(z3.simplify(guard)), "model allows granting a live lease"
                continue
            if state[rid]["st"] != model.ABSENT:  # a reused id: a new lease instance
                state[rid] = fresh(state[rid]["now"])
            out = table.grant(rid, now=now, consumers=consumers, ttl=ttl)
            assert out is None  # nothing is staged (staging_capacity=0)
            steps[rid] = "grant"
            args[rid].update(ttl=cfg.kv_lease_duration if ttl is None else ttl, consumers=consumers)
        elif kind == "renew":
            table.renew(rest[0], now=now)
            for rid in set(rest[0]):
                steps[rid] = "renew"
        elif kind == "transfer_done":
            rid, readers = rest[0], rest[1]
            out = table.transfer_done(rid, now=now, readers=readers)
            if isinstance(out, Release):
                released[rid] = out
            steps[rid] = kind
            # the model's n: the notification's readers, else the granted consumers
            args[rid]["n"] = readers if readers is not None else max(1, state[rid]["consumers"])
        elif kind == "abort":
            rid = rest[0]
            out = table.abort(rid, now=now)
            if isinstance(out, Release):
                released[rid] = out
            steps[rid] = kind
        else:
            for rel in table.expire(now=now):
                released[rel.req_id] = rel
            steps = dict.fromkeys(IDS, "expire")
        for rid in IDS:
            obs = observe(
                table,
                rid,
                state[rid],
                now=now,
                released=released.get(rid),
                swept=steps[rid] == "expire",
            )
            if steps[rid] == "grant":
                obs["grants"] = state[rid]["grants"] + 1
            state[rid] = check_step(
                sys_, steps[rid], state[rid], obs, args=args[rid], params=params
            )


# -- HeartbeatTracker ---------------------------------------------------------------------
ENGINES = ("e1", "e2")
S_BOUND = 3.0

dop = st.one_of(
    st.tuples(st.just("track"), st.sampled_from(ENGINES), st.integers(0, 5)),
    st.tuples(st.just("untrack"), st.integers(0, 5)),
    st.tuples(st.just("drop"), st.sampled_from(ENGINES)),
    st.tuples(
        st.just("due"), st.integers(0, 12).map(lambda k: k / 4), st.sets(st.sampled_from(ENGINES))
    ),
)


@given(ops=st.lists(dop, max_size=40))
def test_heartbeat_tracker_refines_the_engine_model(ops: list[tuple[Any, ...]]) -> None:
    refine_tracker(ops)


def tracker_ops(n: int, seed: int = 11) -> list[list[tuple[Any, ...]]]:
    """Fixed random runs of tracker calls (the same every time), for the seeded bugs
    (tests/test_refinement_table.py)."""
    rnd = random.Random(seed)
    runs = []
    for _ in range(n):
        ops: list[tuple[Any, ...]] = []
        for _ in range(40):
            ops.append(
                rnd.choice(
                    [
                        ("track", rnd.choice(ENGINES), rnd.randint(0, 5)),
                        ("untrack", rnd.randint(0, 5)),
                        ("drop", rnd.choice(ENGINES)),
                        (
                            "due",
                            rnd.randint(0, 12) / 4,
                            set(rnd.sample(ENGINES, rnd.randint(0, 2))),
                        ),
                        ("due", rnd.randint(0, 12) / 4, set()),
                    ]
                )
            )
        runs.append(ops)
    return runs


def refine_tracker(ops: list[tuple[Any, ...]]) -> None:
    """Run tracker calls ``ops`` on a HeartbeatTracker with two engines, checking
    each against the engine model."""
    cfg = LeaseConfig(kv_lease_duration=8, heartbeat_interval=1, lease_extension=4)
    sys_ = model.engine_system()
    params = {"H": cfg.heartbeat_interval, "S": S_BOUND}
    tr = HeartbeatTracker(cfg)
    now = 0.0
    eng = {
        e: {"now": now, "tracked": False, "has_last": False, "last": 0, "pend": False}
        for e in ENGINES
    }
    for kind, *rest in ops:
        if kind == "track":
            e, n = rest
            rid = f"r{n}"
            if rid in tr:
                continue
            was = e in tr.engines()
            tr.track(rid, engine_id=e, now=now)
            if not was:
                eng[e] = check_step(
                    sys_, "track", eng[e], {"tracked": True}, args={}, params=params
                )
        elif kind in ("untrack", "drop"):
            e = tr.engine_of(f"r{rest[0]}") if kind == "untrack" else rest[0]
            if e is None:
                continue
            if kind == "untrack":
                tr.untrack(f"r{rest[0]}")
            else:
                tr.drop_engine(e)
            if e not in tr.engines() and eng[e]["tracked"]:
                eng[e] = check_step(
                    sys_,
                    "untrack_last",
                    eng[e],
                    {"tracked": False, "has_last": False},
                    args={},
                    params=params,
                )
        else:
            dt, pending = rest
            now += min(dt, S_BOUND)
            out = tr.due(now=now, pending=pending)
            assert set(out) <= set(ENGINES)
            for e in ENGINES:
                sent = e in out
                if sent:
                    assert sorted(out[e]) == sorted(
                        f"r{i}" for i in range(6) if tr.engine_of(f"r{i}") == e
                    )
                obs = {
                    "now": now,
                    "pend": e in pending,
                    "tracked": e in tr.engines(),
                    "last": now if sent else eng[e]["last"],
                    "has_last": eng[e]["has_last"] or sent,
                }
                eng[e] = check_step(
                    sys_,
                    "step",
                    eng[e],
                    obs,
                    args={"t": now, "pending": e in pending},
                    params=params,
                )


# -- ClockOffset --------------------------------------------------------------------------
sample = st.tuples(quarter, st.integers(-400, 400).map(lambda k: k / 4), quarter)


@given(
    samples=st.lists(sample, min_size=1, max_size=5),
    now=quarter,
    deadline=st.integers(-400, 400).map(lambda k: k / 4),
    margin=quarter,
    rho=st.sampled_from([0.0, 0.5]),  # 2 rho / (1 - rho) exact in binary: 0 and 2
)
def test_clock_offset_refines_the_gate_model(
    samples: list[tuple[float, float, float]],
    now: float,
    deadline: float,
    margin: float,
    rho: float,
) -> None:
    clock = ClockOffset(rho=rho)
    real = z3.RealSort()
    z_rho = to_z3(rho, real)
    best: tuple[Any, Any, Any] | None = None  # (offset, uncertainty, t0) of the kept sample
    for t0, remote, rtt in samples:
        clock.add_sample(t0=t0, remote_time=remote, t1=t0 + rtt)
        off, unc = model.sample_offset(to_z3(t0, real), to_z3(remote, real), to_z3(t0 + rtt, real))
        if best is not None:
            # compare both aged to the later t0 (the rule, on exact rationals)
            later = max(from_z3(best[2]), Fraction(t0))
            aged_new = R.aged_uncertainty(unc, to_z3(later - Fraction(t0), real), z_rho)
            aged_kept = R.aged_uncertainty(best[1], to_z3(later - from_z3(best[2]), real), z_rho)
            if not from_z3(z3.simplify(aged_new < aged_kept)):
                continue
        best = (off, unc, to_z3(t0, real))
    assert best is not None
    offset, unc, at = (from_z3(x) for x in best)
    assert Fraction(clock.offset) == offset and Fraction(clock.uncertainty) == unc
    assert Fraction(clock.sampled_at) == at
    aged = R.aged_uncertainty(to_z3(unc, real), to_z3(abs(Fraction(now) - at), real), z_rho)
    assert from_z3(z3.simplify(aged)) == Fraction(clock.uncertainty_at(now))
    gate = R.read_allowed(
        *(to_z3(v, real) for v in (deadline, now, clock.offset)),
        aged,
        to_z3(margin, real),
    )
    assert from_z3(gate) == clock.read_allowed(deadline, now=now, margin=margin)
