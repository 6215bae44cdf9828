"""Schedules showing each timing assumption is necessary and each naive variant broken.

Each entry drops one assumption of :mod:`proofs.timing` (T1, T2, or lets the
actual system exceed one bound while T1 and T2 hold for the assumed bounds) or
swaps in a naive variant, and asks z3 for a run of the composed model
(:mod:`proofs.bmc`) in which P releases by expiry a lease D still tracks (I8) —
or, for the insertion-order reaper, in which a lease nobody renews outlives its
bound. These are expected-SAT checks: if z3 finds no schedule, the claim that the
assumption is needed is wrong, and the entry FAILs. Two witnesses (normal
operation, D crash) show the model's good behaviours are reachable under the
assumptions. Configuration is pinned to the defaults (L=30, E=20, H=5); z3
picks every other value, so the printed numbers are one schedule among many.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from leaseproto.core import rules as R

from .bmc import Run, Step, search
from .kit import System, Transition, Values, fmt, model_value
from .model import EXPIRED, GRANTED, STATE_NAMES, lease_system
from .timing_model import Options, build, hq, t1, t2

CONFIG = {"L": 30, "E": 20, "H": 5}
TYPICAL = {
    "R": 1,
    "K": 2,
    "SD": z3.RealVal("1/2"),
    "SP": z3.RealVal("1/2"),
    "dl": z3.RealVal("1/5"),
    "rho": 0,
}


@dataclass
class Case:
    name: str
    claim: str
    opts: Options
    pins: dict[str, Any]
    skeleton: list[Step]
    goal: Callable[[Any, Any], Any]
    extra: Callable[[Any], Any] | None = None
    expect_bad: bool = True
    notes: list[Callable[[Any, Any, Any], str]] = field(default_factory=list)
    system: System | None = None


def _premature(s: Any, p: Any) -> Any:
    return z3.And(z3.Not(s.silent), s.st == EXPIRED)


def _start(s: Any) -> Any:
    """Readable numbers: real time starts at 0, P's and D's clocks elsewhere."""
    return z3.And(s.tau == 0, s.cP == 1000, s.cD == 5000)


def _pins(*free: str) -> dict[str, Any]:
    return {**CONFIG, **{k: v for k, v in TYPICAL.items() if k not in free}}


def _v(m: Any, e: Any) -> str:
    return fmt(model_value(m, e))


def _t_note(m: Any, p: Any, run: Run) -> str:
    lhs1 = p.R + z3.If(hq(p) <= p.K, p.K, hq(p)) + p.SD + p.dl + p.SP
    lhs2 = hq(p) + p.SD + p.dl + p.SP
    return (
        f"T1: {_v(m, lhs1)} < {_v(m, p.L / (1 + p.rho))} is {_v(m, t1(p))}; "
        f"T2: {_v(m, lhs2)} < {_v(m, p.E / (1 + p.rho))} is {_v(m, t2(p))}"
    )


def _act_note(bound: str) -> Callable[[Any, Any, Run], str]:
    def note(m: Any, p: Any, run: Run) -> str:
        return (
            f"assumed {bound} = {_v(m, p[bound])}, actual {_v(m, p[f'{bound}_act'])}; "
            f"T1 and T2 hold for the assumed values"
        )

    return note


def _reclaim_note(m: Any, p: Any, run: Run) -> str:
    assert run.steps is not None
    last = run.steps[-1][3]
    lo = 1 - p.rho
    bound = (
        z3.If(
            last.hash,
            z3.If(last.tg + p.L / lo >= last.th + p.E / lo, last.tg + p.L / lo, last.th + p.E / lo),
            last.tg + p.L / lo,
        )
        + p.SP
    )
    return (
        f"freed at t={_v(m, last.tend)}; I6 bound max(tg + L/(1-rho), th + E/(1-rho)) "
        f"+ S_P = {_v(m, bound)} (last applied heartbeat th={_v(m, last.th)})"
    )


def _exceeds(bound: str, text: str, skeleton: list[Step]) -> Case:
    return Case(
        f"{bound} exceeded",
        text,
        Options(actual=frozenset({bound})),
        _pins(),
        skeleton,
        _premature,
        lambda p: p[f"{bound}_act"] > p[bound],
        notes=[_act_note(bound)],
    )


def cases() -> list[Case]:
    # one heartbeat period: time passes with both sides stepping idly, then past the
    # interval with D's next step due, then that step
    beat: list[Step] = ["advance", "advance", "d_step"]
    keep_sending: list[Step] = ["grant", "track", "d_step", *beat * 6]
    no_strays = Options(strays="none")
    return [
        Case(
            "T1 dropped",
            "without T1 the first heartbeat can arrive after the initial lease ran out",
            Options(assume=frozenset({"T2"})),
            _pins("R", "K"),
            ["grant", "advance", "track", "advance", "handshake", "d_step", "advance", "p_step"],
            _premature,
            lambda p: z3.Not(t1(p)),
            notes=[_t_note],
        ),
        Case(
            "T2 dropped",
            "without T2 a renewed lease can run out before the next heartbeat",
            Options(assume=frozenset({"T1"})),
            _pins("SD"),
            [
                "grant",
                "track",
                "advance",
                "d_step",
                "p_recv",
                "advance",
                "d_step",
                "advance",
                "p_step",
            ],
            lambda s, p: z3.And(_premature(s, p), s.renewed),
            lambda p: z3.Not(t2(p)),
            notes=[_t_note],
        ),
        _exceeds(
            "R",
            "a router transit longer than R delays D's first heartbeat",
            ["grant", "advance", "track", "d_step", "advance", "p_step"],
        ),
        _exceeds(
            "K",
            "a handshake longer than K delays D's first heartbeat",
            ["grant", "track", "advance", "handshake", "d_step", "advance", "p_step"],
        ),
        _exceeds(
            "SD",
            "a D step (forward pass) longer than S_D delays a heartbeat",
            ["grant", "track", "advance", "d_step", "advance", "p_step"],
        ),
        _exceeds(
            "dl",
            "every heartbeat delayed beyond the bound arrives after the lease ran out",
            [*keep_sending, "advance", "p_step"],
        ),
        _exceeds(
            "SP",
            "P's step longer than S_P: the heartbeat waits in P's queue until expire has run",
            [*keep_sending, "advance", "p_step"],
        ),
        Case(
            "rho exceeded",
            "clocks drift 1% while 0 was assumed: P's runs fast, D's slow",
            Options(actual=frozenset({"rho"})),
            _pins("SD"),
            [
                "grant",
                "track",
                "advance",
                "d_step",
                "p_recv",
                "advance",
                "d_step",
                "advance",
                "d_step",
                "advance",
                "p_step",
            ],
            _premature,
            lambda p: p.rho_act == z3.RealVal("1/100"),
            notes=[_act_note("rho"), _t_note],
        ),
        Case(
            "naive: renewal assigns",
            "deadline = now + extension without the max: a "
            "stray heartbeat cuts the initial lease below what T1 relies on",
            Options(naive="assign"),
            _pins("K"),
            ["grant", "p_stray", "track", "advance", "handshake", "d_step", "advance", "p_step"],
            _premature,
            notes=[_t_note],
        ),
        Case(
            "naive: two clocks",
            "the deadline is stamped on P's scheduler clock and "
            "compared on a worker's clock (upstream B3)",
            Options(naive="two_clocks"),
            _pins(),
            ["grant", "track", "d_step", "p_step"],
            _premature,
            notes=[_t_note],
        ),
        reaper_case(),
        Case(
            "witness: normal operation",
            "under T1 and T2 D's heartbeats keep the lease past its initial ttl",
            no_strays,
            _pins(),
            ["grant", "track", "d_step", "p_recv", *[*beat, "p_recv"] * 7],
            lambda s, p: z3.And(s.st == GRANTED, z3.Not(s.silent), s.tau > s.tg + p.L + 1),
            expect_bad=False,
            notes=[_t_note],
        ),
        Case(
            "witness: D crashes",
            "after D goes silent P frees the lease within the I6 bound",
            no_strays,
            _pins(),
            ["grant", "track", "d_step", "p_recv", "d_stop", "advance", "advance", "p_step"],
            lambda s, p: z3.And(s.silent, s.st == EXPIRED, s.renewed),
            expect_bad=False,
            notes=[_reclaim_note],
        ),
    ]


# -- the insertion-order reaper (upstream B1): two leases --------------------------------
def reaper_system() -> System:
    """Two leases A (granted first) and B on one P clock; ``expire_naive`` walks them
    in grant order and stops at the first one not due."""
    one = lease_system(cap=False)
    fields = {f"{x}_{f}": sort for x in "ab" for f, sort in one.fields.items()}

    def view(s: Any, x: str) -> Values:
        return Values({f: s[f"{x}_{f}"] for f in one.fields})

    def lift(tname: str, x: str, also_now: bool = True) -> Any:
        t = one.transition(tname)

        def upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
            u = {f"{x}_{k}": v for k, v in t.update(view(s, x), a, p).items()}
            other = "b" if x == "a" else "a"
            if also_now:
                u[f"{other}_now"] = a.t
            return u

        return Transition(
            f"{t.name}_{x}",
            f"{t.text} for lease {x.upper()}",
            t.args,
            lambda s, a, p: t.guard(view(s, x), a, p),
            upd,
        )

    def naive_upd(s: Any, a: Any, p: Any) -> dict[str, Any]:
        due_a = R.expire_due(s.a_st, s.a_deadline, a.t)
        st_a = R.expire_state(s.a_st, s.a_deadline, a.t)
        st_b = z3.If(
            z3.Or(due_a, s.a_st != GRANTED),  # stop at the first live entry not due
            R.expire_state(s.b_st, s.b_deadline, a.t),
            s.b_st,
        )
        return {
            "a_st": st_a,
            "b_st": st_b,
            "a_now": a.t,
            "b_now": a.t,
            "a_swept": a.t,
            "b_swept": a.t,
        }

    ts = [
        lift("grant", "a"),
        lift("grant", "b"),
        lift("renew", "a"),
        lift("renew", "b"),
        Transition(
            "expire_naive",
            "insertion-order reaper",
            {"t": z3.RealSort()},
            lambda s, a, p: z3.And(a.t >= s.a_now, a.t >= s.b_now),
            naive_upd,
        ),
    ]
    return System(
        "reaper-naive",
        "two leases, insertion-order reaper",
        fields,
        one.params,
        one.axioms,
        lambda s, p: z3.And(
            one.init(view(s, "a"), p), one.init(view(s, "b"), p), s.a_now == s.b_now
        ),
        ts,
    )


def reaper_case() -> Case:
    def goal(s: Any, p: Any) -> Any:
        return z3.And(
            s.b_st == GRANTED,
            z3.Not(s.b_has_lr),
            s.b_swept == s.b_now,
            s.b_deadline + 10 <= s.b_swept,
            s.a_st == GRANTED,
        )

    def ttl30(s: Any, a: Any, p: Any) -> Any:
        return a.ttl == 30

    def later(s: Any, a: Any, p: Any) -> Any:
        return z3.And(a.ttl == 30, a.t > s.a_granted_at)

    def never_absent(m: Any, p: Any, run: Run) -> str:
        assert run.steps is not None
        _, pre, a, _ = run.steps[-1]
        st = R.expire_state(pre.b_st, pre.b_deadline, a.t)
        return (
            f"leaseproto's expire(now) checks every due lease: on this state it "
            f"releases B ({STATE_NAMES[model_value(m, st)]}) (I4, I5 proven in system lease)"
        )

    return Case(
        "naive: insertion-order reaper",
        "a reaper that stops at the first "
        "unexpired entry in grant order strands B, whose decoder is gone, behind "
        "A, which keeps being renewed (upstream B1; breaks I4 and I5)",
        Options(),
        {"E": 20},
        [("grant_a", ttl30), ("grant_b", later), "renew_a", "expire_naive"],
        goal,
        system=reaper_system(),
        notes=[never_absent],
    )


def case_system(case: Case) -> System:
    return case.system or build(case.opts)


def case_start(case: Case) -> Callable[[Any], Any]:
    """Readable numbers: real time starts at 0, the clocks at other readings
    (the worker's as in upstream B3's report)."""
    if case.system is not None:
        return lambda s: s.a_now == 0
    if case.opts.naive == "two_clocks":
        return lambda s: z3.And(_start(s), s.cW == 4600)
    return _start


# -- narration ----------------------------------------------------------------------------
def _f(m: Any, e: Any) -> str:
    v = model_value(m, e)
    return str(v).lower() if isinstance(v, bool) else f"{float(v):.3f}"


def _renewal(m: Any, s: Any, s2: Any, src: str) -> str:
    old, new = _f(m, s.deadline), _f(m, s2.deadline)
    if not model_value(m, R.renew_applies(s.st, s.deadline, s.cP)):
        return f"P gets {src}: lease {STATE_NAMES[model_value(m, s.st)]} or lapsed, ignored"
    if old == new:
        return f"P applies {src}: deadline stays {old} (the later one is kept)"
    return f"P applies {src}: deadline {old} -> {new}"


def narrate(m: Any, name: str, s: Any, a: Any, s2: Any, *, worker: bool = False) -> str:
    def f(e: Any) -> str:
        return _f(m, e)

    if name == "grant":
        return f"P grants the lease: deadline {f(s2.deadline)} on P's clock"
    if name == "track":
        eng = "connected" if model_value(m, a.conn0) else "handshake pending"
        if model_value(m, a.hasD0):
            eng += f", its last heartbeat (other requests) at t={f(a.tsD0)}"
        return f"D tracks the request ({f(s.tau - s.tg)} s after the grant); engine {eng}"
    if name == "handshake":
        return f"D's engine connects ({f(s.tau - s.ttrack)} s after the track)"
    if name == "d_step":
        if model_value(m, z3.And(s2.hasO, s2.tso == s.tau, z3.Not(z3.And(s.hasO, s.tso == s.tau)))):
            return "D steps: sends HB naming the request"
        return "D steps: no heartbeat due"
    if name == "p_step":
        if model_value(m, s.st != s2.st):
            clocks = f"P clock {f(s.cP)}" + (f", worker clock {f(s.cW)}" if worker else "")
            return (
                f"P steps: expire releases the lease {STATE_NAMES[model_value(m, s2.st)]}"
                f" (deadline {f(s.deadline)}; {clocks})"
            )
        return "P steps: nothing due"
    if name == "p_recv":
        return _renewal(m, s, s2, f"D's heartbeat sent at t={f(s.tout)}")
    if name == "p_stray":
        return _renewal(
            m,
            s,
            s2,
            "a stray heartbeat naming the id (from an instance the "
            "router gave up, or a stale duplicate)",
        )
    if name == "d_stop":
        return "D goes silent (crash)"
    if name == "advance":
        ps = "P steps, nothing due" if model_value(m, a.p_busy) else "P does not step"
        ds = "D steps, nothing due" if model_value(m, a.d_busy) else "D does not step"
        return f"{f(a.dt)} s pass ({ps}; {ds})"
    return name


def narrate_reaper(m: Any, name: str, s: Any, a: Any, s2: Any) -> str:
    def f(e: Any) -> str:
        return _f(m, e)

    if name.startswith("grant_"):
        x = name[-1]
        return f"grant {x.upper()} with ttl {f(a.ttl)}: deadline {f(s2[f'{x}_deadline'])}"
    if name.startswith("renew_"):
        x = name[-1]
        return (
            f"heartbeat for {x.upper()}: deadline {f(s[f'{x}_deadline'])} -> "
            f"{f(s2[f'{x}_deadline'])}"
        )
    st = {x: STATE_NAMES[model_value(m, s2[f"{x}_st"])] for x in "ab"}
    return (
        f"naive expire: A (deadline {f(s['a_deadline'])}) is first and not due, so "
        f"the walk stops: A {st['a']}, B {st['b']} with deadline {f(s['b_deadline'])}"
        f" <= now - 10"
    )


def show(case: Case, run: Run, out: Any) -> None:
    m, p = run.model, run.params
    assert run.steps is not None and p is not None
    reaper = case.system is not None
    print("    params: " + " ".join(f"{n}={_v(m, p[n])}" for n in p.names()), file=out)
    for note in case.notes:
        print(f"    {note(m, p, run)}", file=out)
    print(
        "          now  event" if reaper else "      t(real)    P clock    D clock  event", file=out
    )
    for name, s, a, s2 in run.steps:
        if reaper:
            t = a.t if "t" in a.names() else s.a_now
            print(f"    {_f(m, t):>9}  {narrate_reaper(m, name, s, a, s2)}", file=out)
        else:
            print(
                f"    {_f(m, s.tau):>9}  {_f(m, s.cP):>9}  {_f(m, s.cD):>9}  "
                f"{narrate(m, name, s, a, s2, worker=case.opts.naive == 'two_clocks')}",
                file=out,
            )


def run(out: Any = None, timeout_ms: int = 20_000, names: list[str] | None = None) -> int:
    """Search every case and print each schedule. Returns 1 if any search failed."""
    out = out or sys.stdout
    status = 0
    print(
        "schedules (z3 picks every time, delay, clock reading and unpinned value; "
        "t is real time, P and D read their own clocks):",
        file=out,
    )
    for case in cases():
        if names and case.name not in names:
            continue
        r = search(
            case_system(case),
            case.skeleton,
            case.goal,
            pins=case.pins,
            extra=case.extra,
            start=case_start(case),
            timeout_ms=timeout_ms,
        )
        kind = "counterexample" if case.expect_bad else "witness"
        if r.answer == "sat":
            print(f"ok   {kind} [{case.name}]: {case.claim}  ({r.seconds * 1000:.0f} ms)", file=out)
            show(case, r, out)
        else:
            status = 1
            why = (
                "z3 found no schedule: the necessity claim is wrong"
                if r.answer == "unsat"
                else f"z3 answered {r.answer} ({r.reason}): counted as FAIL"
            )
            print(f"FAIL {kind} [{case.name}]: {why}", file=out)
    return status
