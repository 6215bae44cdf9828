"""The cases of ``leaseproto prove --counterexamples``: each drops one assumption
of :mod:`proofs.timing` (T1, T2, or lets the actual system exceed one bound
while T1 and T2 hold for the assumed bounds) or swaps in a naive variant, and
says what z3 must find (a run of the composed model in which P releases by
expiry a lease D still tracks, I8); two witnesses show the model's good
behaviours are reachable. Searched and printed by :mod:`proofs.counterexamples`;
replayed on the real code by :mod:`proofs.cx_replay`.

Every clock runs at one constant rate in these schedules (z3 picks it, within
the drift bound), so ``leaseproto replay``'s linear clocks can run them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from .bmc import Run, Step
from .kit import System, fmt, model_value
from .model import EXPIRED, GRANTED
from .timing_model import build
from .timing_state import Options, hq, t1, t2

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


def num(m: Any, e: Any) -> str:
    """A model value for a timeline: 3 decimals (bools as words)."""
    v = model_value(m, e)
    return str(v).lower() if isinstance(v, bool) else f"{float(v):.3f}"


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


#: the constant rate of each clock in a schedule (z3 picks them, within the drift bound)
RATES = {c: z3.Real(f"rate_{c}") for c in ("cP", "cD", "cW")}


def steady(s: Any, a: Any, p: Any) -> Any:
    """An ``advance`` at the schedule's constant clock rates."""
    return z3.And(*[a[f"{c}2"] - s[c] == rate * a.dt for c, rate in RATES.items()])


def with_arrivals(skeleton: list[Step]) -> list[Step]:
    """Each heartbeat P handles arrives first (``arrive`` before ``p_recv``), and
    time passes at constant clock rates."""
    out: list[Step] = []
    arrived = False
    for step in skeleton:
        if step == "p_recv" and not arrived:
            out.append("arrive")
        arrived = (step == "arrive" or arrived) and step != "p_recv"
        out.append(("advance", steady) if step == "advance" else step)
    return out


def timing_cases() -> list[Case]:
    """The schedules of the composed model (the reaper's is :mod:`.cx_reaper`)."""
    # one heartbeat period: time passes with both sides stepping idly, then past the
    # interval with D's next step due, then that step
    beat: list[Step] = ["advance", "advance", "d_step"]
    keep_sending: list[Step] = ["grant", "track", "d_step", *beat * 6]
    no_strays = Options(strays="none")
    # a first heartbeat applied, then time passes with one more D step
    renewed_once: list[Step] = [
        "grant",
        "track",
        "advance",
        "d_step",
        "p_recv",
        "advance",
        "d_step",
        "advance",
    ]
    out = [
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
            [*renewed_once, "p_step"],
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
            "one P step longer than S_P: D's heartbeats wait in P's queue until the lease "
            "has lapsed, then expire runs",
            ["grant", "track", "d_step", "arrive", *beat * 6, "advance", "p_recv", "p_step"],
        ),
        Case(
            "rho exceeded",
            "clocks drift 1% while 0 was assumed: P's runs fast, D's slow",
            Options(actual=frozenset({"rho"})),
            _pins("SD"),
            [*renewed_once, "d_step", "advance", "arrive", "advance", "p_recv", "p_step"],
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
    for case in out:
        case.skeleton = with_arrivals(case.skeleton)
        rates = FAST_P_SLOW_D if case.name == "rho exceeded" else {}
        case.extra = pin_rates(case.extra, rates)
    return out


#: the rates of the drift schedule: P's clock 1% fast, D's 1% slow
FAST_P_SLOW_D = {"cP": z3.RealVal("101/100"), "cD": z3.RealVal("99/100")}


def pin_rates(extra: Callable[[Any], Any] | None, rates: dict[str, Any]) -> Callable[[Any], Any]:
    """``extra`` with every clock rate pinned (1 unless ``rates`` says otherwise):
    ``rate * dt`` stays linear, so z3 answers fast."""

    def pinned(p: Any) -> Any:
        fixed = [r == rates.get(c, 1) for c, r in RATES.items()]
        return z3.And(*fixed, *([extra(p)] if extra is not None else []))

    return pinned


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
