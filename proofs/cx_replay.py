"""A schedule of the composed model as a ``leaseproto replay`` scenario (spec §12),
so every counterexample z3 prints can be run on the real code.

Each model step becomes scenario lines at its real time (shifted so nothing is
before 0): ``grant``, ``track`` (an engine already heartbeating other requests
gets a request ``o`` tracked and a ``d_step`` at the instant of its last
heartbeat), ``d_step`` (its heartbeats are delivered by explicit ``deliver``
lines, not by the replay's network), ``arrive`` (the ``deliver`` of the oldest
unprocessed heartbeat), ``p_recv`` and ``p_step`` (``p_step``: P handles its
inbox, then expires), ``p_stray`` (a ``deliver`` of ``HB:r`` and a step),
``advance`` (a ``p_step`` / ``d_step`` at its end when that side was busy).
Heartbeats the model does not track (sent while an older one is unprocessed)
arrive at the latest the schedule's actual delay bound allows. Clocks are the
schedule's constant rates; the handshake takes what it took in the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from leaseproto.scenarios import replay_text
from leaseproto.scenarios.replay import ReplayResult

from .bmc import Run
from .cx_cases import RATES, Case
from .kit import model_value

RID = "r"
OTHER = "o"
NEVER = 10**6


@dataclass
class Replayed:
    """A schedule run on the real code: the scenario and what the replay did."""

    scenario: str
    result: ReplayResult
    model_sends: list[float]

    def expired_while_tracked(self) -> bool:
        """P released the request EXPIRED while D still tracked it (I8's violation)."""
        crashed = False
        for e in self.result.events:
            crashed = crashed or e.kind == "crash"
            if e.kind == "release" and e.data.get("id") == RID:
                return e.data.get("reason") == "expired" and not crashed
        return False

    def released(self) -> str | None:
        for e in self.result.events:
            if e.kind == "release" and e.data.get("id") == RID:
                return str(e.data.get("reason"))
        return None

    def replay_sends(self) -> list[float]:
        """When the real tracker sent a heartbeat naming the request."""
        return [
            e.t
            for e in self.result.events
            if e.kind == "heartbeat"
            and e.where == "D"
            and RID in str(e.data.get("payload", "")).removeprefix("HB:").split(",")
        ]


def to_scenario(case: Case, run: Run) -> tuple[str, list[float]]:
    """The scenario text of ``run`` and the instants the model's D sent a heartbeat
    naming the request."""
    assert run.steps is not None and run.params is not None
    m, p = run.model, run.params

    def v(e: Any) -> Any:
        return model_value(m, e)

    shift = Fraction(0)
    for name, s, a, _ in run.steps:
        if name == "track" and v(a.hasD0):
            shift = max(shift, -_when(v, s, a.lastD0))
    ops: list[tuple[Fraction, int, dict[str, Any]]] = []

    def at(t: Fraction, op: dict[str, Any], late: bool = False) -> None:
        ops.append((t + shift, 1 if late else 0, {"t": float(t + shift), **op}))

    handshake: Fraction | None = None
    track_t = Fraction(0)
    dl = v(p["dl_act"] if "dl_act" in p.names() else p.dl)
    payload = f"HB:{RID}"
    sends: list[float] = []
    for name, s, a, s2 in run.steps:
        tau = v(s.tau)
        if name == "grant":
            at(tau, {"op": "grant", "id": RID})
        elif name == "track":
            track_t = tau
            if v(a.hasD0):
                t_o = _when(v, s, a.lastD0)
                at(t_o, {"op": "track", "id": OTHER})
                at(t_o, {"op": "d_step", "deliver": False})
                payload = f"HB:{OTHER},{RID}"
            if v(a.conn0):
                handshake = Fraction(0)
            at(tau, {"op": "track", "id": RID})
        elif name == "handshake":
            handshake = tau - track_t
        elif name == "d_step":
            at(tau, {"op": "d_step", "deliver": False})
            if v(s2.hasO) and v(s2.tso) == tau and not (v(s.hasO) and v(s.tso) == tau):
                sends.append(float(tau + shift))
                if v(s.out):  # not the oldest unprocessed: untracked, arrives at the latest
                    at(tau + dl, {"op": "deliver", "msg": payload}, late=True)
        elif name == "arrive":
            at(tau, {"op": "deliver", "msg": payload})
        elif name in ("p_recv", "p_step"):
            at(tau, {"op": "p_step"})
        elif name == "p_stray":
            at(tau, {"op": "deliver", "msg": f"HB:{RID}"})
            at(tau, {"op": "p_step"})
        elif name == "d_stop":
            at(tau, {"op": "d_crash"})
        elif name == "advance":
            t2 = tau + v(a.dt)
            if v(a.p_busy):
                at(t2, {"op": "p_step"})
            if v(a.d_busy):
                at(t2, {"op": "d_step", "deliver": False})
    last = run.steps[-1][3]
    if v(last.out) and not v(last.arr):  # the oldest unprocessed one arrives after the run
        at(v(last.tout) + dl, {"op": "deliver", "msg": payload}, late=True)
    rate = {c: v(r) or Fraction(1) for c, r in RATES.items()}
    first = run.steps[0][1]
    clocks = {
        side: {"rate": float(rate[c]), "offset": float(v(first[c]) - rate[c] * shift)}
        for side, c in (("P", "cP"), ("D", "cD"))
    }
    cfg = {"kv_lease_duration": v(p.L), "lease_extension": v(p.E), "heartbeat_interval": v(p.H)}
    header = {
        "scenario": f"counterexample: {case.name}",
        "config": {k: float(x) for k, x in cfg.items()},
        "engines": {"P": {"handshake": float(NEVER if handshake is None else handshake)}},
        "clocks": clocks,
    }
    ops.sort(key=lambda o: (o[0], o[1]))
    lines = [json.dumps(header)] + [json.dumps(op) for _, _, op in ops]
    return "\n".join(lines) + "\n", sends


def _when(v: Any, s: Any, d_clock: Any) -> Fraction:
    """The real instant D's clock read ``d_clock`` (the schedule's clocks are linear)."""
    rate = v(RATES["cD"]) or Fraction(1)
    result: Fraction = v(s.tau) - (v(s.cD) - v(d_clock)) / rate
    return result


def reaper_scenario(run: Run) -> str:
    """The naive reaper's schedule (two leases ``a``, ``b``) as a scenario: grants with
    their ttls, A's heartbeat, and a step where the naive reaper ran."""
    assert run.steps is not None
    lines = [json.dumps({"scenario": "counterexample: naive: insertion-order reaper"})]
    for name, _, a, _ in run.steps:
        t = float(model_value(run.model, a.t))
        if name.startswith("grant_"):
            ttl = float(model_value(run.model, a.ttl))
            lines.append(json.dumps({"t": t, "op": "grant", "id": name[-1], "ttl": ttl}))
        elif name == "renew_a":
            lines.append(json.dumps({"t": t, "op": "deliver", "msg": "HB:a"}))
            lines.append(json.dumps({"t": t, "op": "p_step"}))
        else:
            lines.append(json.dumps({"t": t, "op": "p_step"}))
    return "\n".join(lines) + "\n"


def replay(case: Case, run: Run) -> Replayed:
    """Run ``case``'s schedule ``run`` on the real code."""
    sends: list[float]
    if case.system is not None:
        text, sends = reaper_scenario(run), []
    else:
        text, sends = to_scenario(case, run)
    return Replayed(text, replay_text(text), sends)


def verdict(case: Case, rep: Replayed) -> tuple[bool, str]:
    """Whether the real code does what the schedule claims, and a line saying so:
    a counterexample must reproduce its violation (else the model has a behaviour
    the implementation lacks); a naive variant's must not (the real code is not
    naive); a witness must behave as it says."""
    if rep.result.error is not None:
        return False, f"the scenario does not run: {rep.result.error}"
    if rep.model_sends != rep.replay_sends():
        return False, (f"D's heartbeats differ: model {rep.model_sends}, real {rep.replay_sends()}")
    if case.system is not None:  # the reaper: the real expire releases B
        b = [e for e in rep.result.events if e.kind == "release" and e.data.get("id") == "b"]
        ok = bool(b) and b[0].data.get("reason") == "expired"
        return ok, "the real expire releases B EXPIRED at that step" if ok else "B not released"
    bad = rep.expired_while_tracked()
    if case.name.startswith("naive"):
        return not bad, (
            "the real code keeps the lease (it is not the naive variant)"
            if not bad
            else "the real code expires it too: it has the naive bug"
        )
    if case.expect_bad:
        return bad, (
            "reproduced: P releases r EXPIRED while D tracks it"
            if bad
            else "NOT reproduced on the real code: the model has a behaviour it lacks"
        )
    if "crash" in case.name:
        ok = rep.released() == "expired" and not bad
        return ok, "P frees r EXPIRED after D's crash" if ok else "r not freed after the crash"
    return rep.released() is None, (
        "the lease stays live" if rep.released() is None else "the real code releases it"
    )
