"""Schedules showing each timing assumption is necessary and each naive variant broken.

The cases are :mod:`proofs.cx_cases` and :mod:`proofs.cx_reaper`; this module
searches and prints them.

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
Last, the turn-2 read with vLLM's gate only (:mod:`.cx_turn2`): z3's refutation
of ``I14 turn2 gate-only`` as a schedule, replayed in a mirrored world.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import z3

from leaseproto.core import rules as R

from . import cx_replay, cx_turn2
from .bmc import Run, search
from .cx_cases import Case, case_start, case_system, num, timing_cases
from .cx_reaper import narrate_reaper, reaper_case
from .kit import fmt, model_value
from .model import STATE_NAMES

__all__ = ["Case", "case_start", "case_system", "cases", "narrate", "run", "show"]


def cases() -> list[Case]:
    """Every case: the counterexamples, the reaper's, then the witnesses."""
    timing = timing_cases()
    return [
        *(c for c in timing if c.expect_bad),
        reaper_case(),
        *(c for c in timing if not c.expect_bad),
    ]


# -- narration ----------------------------------------------------------------------------
def _renewal(m: Any, s: Any, s2: Any, src: str) -> str:
    old, new = num(m, s.deadline), num(m, s2.deadline)
    if not model_value(m, R.renew_applies(s.st, s.deadline, s.cP)):
        return f"P gets {src}: lease {STATE_NAMES[model_value(m, s.st)]} or lapsed, ignored"
    if old == new:
        return f"P applies {src}: deadline stays {old} (the later one is kept)"
    return f"P applies {src}: deadline {old} -> {new}"


def narrate(m: Any, name: str, s: Any, a: Any, s2: Any, *, worker: bool = False) -> str:
    def f(e: Any) -> str:
        return num(m, e)

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
    if name == "arrive":
        return f"D's heartbeat sent at t={f(s.tout)} arrives at P"
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


def show(case: Case, run: Run, out: Any) -> None:
    m, p = run.model, run.params
    assert run.steps is not None and p is not None
    reaper = case.system is not None
    print(
        "    params: " + " ".join(f"{n}={fmt(model_value(m, p[n]))}" for n in p.names()), file=out
    )
    for note in case.notes:
        print(f"    {note(m, p, run)}", file=out)
    print(
        "          now  event" if reaper else "      t(real)    P clock    D clock  event", file=out
    )
    for name, s, a, s2 in run.steps:
        if reaper:
            t = a.t if "t" in a.names() else s.a_now
            print(f"    {num(m, t):>9}  {narrate_reaper(m, name, s, a, s2)}", file=out)
        else:
            print(
                f"    {num(m, s.tau):>9}  {num(m, s.cP):>9}  {num(m, s.cD):>9}  "
                f"{narrate(m, name, s, a, s2, worker=case.opts.naive == 'two_clocks')}",
                file=out,
            )


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def run(
    out: Any = None,
    timeout_ms: int = 20_000,
    names: list[str] | None = None,
    scenarios: str | Path | None = None,
) -> int:
    """Search every case, print each schedule and replay it on the real code
    (:mod:`.cx_replay`; ``scenarios``: also write each as a scenario file there).
    Returns 1 if a search failed or a replay does not do what the schedule says."""
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
            rep = cx_replay.replay(case, r)
            ok, text = cx_replay.verdict(case, rep)
            print(
                f"    {'ok  ' if ok else 'FAIL'} on the real code (leaseproto replay): {text}",
                file=out,
            )
            if not ok:
                status = 1
            if scenarios is not None:
                path = Path(scenarios) / f"{_slug(case.name)}.jsonl"
                path.write_text(rep.scenario)
        else:
            status = 1
            why = (
                "z3 found no schedule: the necessity claim is wrong"
                if r.answer == "unsat"
                else f"z3 answered {r.answer} ({r.reason}): counted as FAIL"
            )
            print(f"FAIL {kind} [{case.name}]: {why}", file=out)
    if not names or cx_turn2.NAME in names:
        status |= _turn2(out, timeout_ms, scenarios)
    return status


def _turn2(out: Any, timeout_ms: int, scenarios: str | Path | None) -> int:
    """The gate-only turn-2 read (:mod:`.cx_turn2`), searched, printed and replayed."""
    r = cx_turn2.search(timeout_ms)
    if r.answer != "sat":
        print(f"FAIL counterexample [{cx_turn2.NAME}]: z3 answered {r.answer}", file=out)
        return 1
    print(
        f"ok   counterexample [{cx_turn2.NAME}]: {cx_turn2.CLAIM}  ({r.seconds * 1000:.0f} ms)",
        file=out,
    )
    cx_turn2.show(r, out)
    text, result = cx_turn2.replay(r)
    ok, why = cx_turn2.verdict(result)
    print(f"    {'ok  ' if ok else 'FAIL'} on the real code (leaseproto replay): {why}", file=out)
    if scenarios is not None:
        (Path(scenarios) / f"{_slug(cx_turn2.NAME)}.jsonl").write_text(text)
    return 0 if ok else 1
