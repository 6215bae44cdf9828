"""The gate-only turn-2 read refuted (``I14 turn2 gate-only`` of
:mod:`proofs.timing_turn2`) as a schedule that ``leaseproto prove
--counterexamples`` prints and replays on the real code, like its other cases.

z3 solves the refutation's formula (the gate admits at P's ``now``, P pauses,
D frees at its first step with its clock at or past the deadline and reuses
after, the READ completes no earlier than the reuse) with the clocks pinned
linear and readable: real time from 0, P's clock at 1000 + t and D's at
5000 + t (no drift, so ``leaseproto replay``'s linear clocks run it), the
handshake's offset sample at real 0 with a 2 ms round trip, vLLM's margin of
5 s, D's cached turn granted at 0 for ``decoder_kv_blocks_ttl`` = 480 s, a
10 ms READ (so the pause, not a long READ, makes it late) and the gate at
470 s (the user back with 10 s left). z3 picks the pause and when D frees and
reuses. The schedule becomes a mirrored scenario (D grants, P reads, spec
§12.1): the real ``ClockOffset`` gate must admit the read, D's real
``LeaseTable`` must free the lease before the READ completes, the gate-only
use must be ``stale`` and the verified one ``recomputed`` on D's ``NK``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from leaseproto.scenarios import replay_text
from leaseproto.scenarios.replay import ReplayResult

from .kit import model_value
from .timing_turn2 import naive_refutations

__all__ = ["NAME", "Schedule", "replay", "search", "show", "verdict"]

NAME = "turn2 gate-only"
CLAIM = (
    "a turn-2 read the gate admits, P pauses after the gate, D frees and reuses the "
    "blocks before the READ completes: used without a verdict, it is wrong (B4; I14)"
)
LID = "X"
P0, D0, TTL, MARGIN, RTT = 1000, 5000, 480, 5, Fraction(2, 1000)
READ_S = Fraction(1, 100)
RETURN = 470


@dataclass
class Schedule:
    """z3's answer; the instants (real time) when sat."""

    answer: str
    seconds: float
    values: dict[str, Fraction] | None = None


def _v(name: str) -> Any:
    return z3.Real(name)  # the theorem's constants, by name


def search(timeout_ms: int = 20_000) -> Schedule:
    (th,) = [t for t in naive_refutations() if t.name == NAME]
    pins = [
        _v("rho") == 0,
        _v("tau_b") == RTT / 2,
        _v("t0") == P0,
        _v("t1") == P0 + RTT,
        _v("local_at_b") == P0 + RTT / 2,
        _v("T") == D0 + RTT / 2,
        _v("now") == P0 + _v("tau"),
        _v("peer_at_gate") == D0 + _v("tau"),
        _v("d_clock_free") == D0 + _v("t_free"),
        _v("margin") == MARGIN,
        _v("remote_deadline") == D0 + TTL,
        _v("read_s") == READ_S,  # a short READ: the pause is what makes it late
        _v("tau") == RETURN,  # the user comes back with 10 s of the TTL left
    ]
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(th.hyps, z3.Not(th.goal), *pins)
    start = time.perf_counter()
    answer = s.check()
    took = time.perf_counter() - start
    if answer != z3.sat:
        return Schedule(str(answer), took)
    m = s.model()
    names = ("tau", "pause", "read_s", "t_free", "t_reuse", "now", "remote_deadline")
    return Schedule("sat", took, {n: Fraction(model_value(m, _v(n))) for n in names})


def _times(v: dict[str, Fraction]) -> dict[str, float]:
    done = v["tau"] + v["pause"] + v["read_s"]
    return {k: float(x) for k, x in {**v, "done": done}.items()}


def show(sched: Schedule, out: Any) -> None:
    """The schedule as a timeline, P's and D's clocks beside real time."""
    assert sched.values is not None
    t = _times(sched.values)
    rows = [
        (0.0, f"D grants {LID} (turn 1 cached) for {TTL} s: deadline {D0 + TTL} on D's clock"),
        (float(RTT), f"P's handshake sample: offset {D0 - P0} +- {float(RTT) / 2:g}"),
        (
            t["tau"],
            f"P's gate admits the read: now {t['now']:.3f} + margin {MARGIN} < deadline "
            f"{D0 + TTL} - offset {D0 - P0}; P pauses {t['pause']:.3f} s",
        ),
        (t["t_free"], f"D steps with its clock at {D0 + t['t_free']:.3f}: frees {LID}"),
        (t["t_reuse"], f"D hands {LID}'s blocks to another request"),
        (t["done"], f"P's READ completes ({t['read_s']:.3f} s long): reused blocks"),
    ]
    print("      t(real)    P clock    D clock  event", file=out)
    for at, text in rows:
        print(f"    {at:>9.3f}  {P0 + at:>9.3f}  {D0 + at:>9.3f}  {text}", file=out)


def scenario(sched: Schedule) -> str:
    """The schedule as a mirrored ``leaseproto replay`` scenario."""
    assert sched.values is not None
    t = _times(sched.values)
    header = {
        "scenario": f"counterexample: {NAME}",
        "grantor": "D",
        "config": {"kv_lease_duration": 30, "decoder_kv_blocks_ttl": TTL},
        "clocks": {"P": {"offset": P0}, "D": {"offset": D0}},
    }
    sample = {"sampled_at": 0, "rtt": float(RTT)}
    ops: list[tuple[float, dict[str, Any]]] = [
        (0.0, {"op": "grant", "id": LID, "ttl": TTL}),
        (t["tau"], {"op": "gate", "id": LID, "margin": MARGIN, "rho": 0, **sample}),
        (t["tau"], {"op": "note", "text": f"P pauses {t['pause']:.6g} s after the gate"}),
        (t["t_free"], {"op": "d_step"}),
        (t["t_reuse"], {"op": "note", "text": f"D hands {LID}'s blocks to another request"}),
        (t["done"], {"op": "send", "transfer_done": LID}),
        (t["done"], {"op": "use", "id": LID, "verify": False}),
        (t["done"], {"op": "d_step"}),
        (t["done"], {"op": "use", "id": LID, "verify": True}),
    ]
    lines = [json.dumps(header)] + [json.dumps({"t": at, **op}) for at, op in ops]
    return "\n".join(lines) + "\n"


def replay(sched: Schedule) -> tuple[str, ReplayResult]:
    text = scenario(sched)
    return text, replay_text(text)


def verdict(result: ReplayResult) -> tuple[bool, str]:
    """Whether the real code does what the schedule claims, and a line saying so."""
    if result.error is not None:
        return False, f"the scenario does not run: {result.error}"
    ev = result.events
    admitted = [e.data.get("admits") for e in ev if e.kind == "gate"] == [True]
    freed = [e for e in ev if e.kind == "release" and e.data.get("id") == LID]
    uses = [e.data.get("outcome") for e in ev if e.kind == "use"]
    nk = [e.data.get("verdict") for e in ev if e.kind == "late_transfer"]
    if not admitted:
        return False, "the real gate refuses the read: the model's gate is not the code's"
    if not freed or freed[0].data.get("reason") != "expired":
        return False, "D's real table does not free the lease by expiry"
    if uses != ["stale", "recomputed"] or nk != [f"NK:expired:{LID}"]:
        return False, f"NOT reproduced: uses {uses}, D's verdicts {nk}"
    return True, (
        f"reproduced: the real gate admits, D's table frees {LID} at t={freed[0].t:.3f} "
        f"before the READ completes; gate-only uses it (stale), D answers {nk[0]} and a "
        "verifying P recomputes"
    )
