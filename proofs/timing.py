"""The timing theorems: P and D composed, in real time, with delays and drift.

Symbols (team brief): H heartbeat_interval, E lease_extension, L the lease's
initial ttl (kv_lease_duration), C max_lease_lifetime, S_D / S_P the longest
gap between two lease steps of D / P, dl (the brief's delta) the one-way
notification delay bound, K the handshake bound, R the router transit (P's grant to D's track), rho
the clock-rate drift bound (every clock runs at a rate within [1-rho, 1+rho] of real
time, with any offset: each side measures only durations on its own clock). All
are real-valued unknowns; the proofs hold for every value satisfying the stated
inequalities. The model is :mod:`proofs.timing_model`; P's and D's rules in it
are :mod:`leaseproto.core.rules` evaluated on z3 terms.

Assumptions (axioms of the proofs; ``H' = H/(1-rho)`` is the longest real time
D's interval timer takes to run out)::

    T1  R + max(K, H') + S_D + dl + S_P  <  L / (1+rho)      (first heartbeat)
    T2  H' + S_D + dl + S_P              <  E / (1+rho)      (steady state)

plus ``0 <= rho < 1`` and positive durations. D's engine may already be
connected and heartbeating other requests when it tracks this one; heartbeats
may be duplicated, reordered or delayed without bound, and heartbeats naming the
request may come from elsewhere (another decode instance, a stale duplicate) at
any time: only the oldest heartbeat D sent that P has not yet applied is
required to be applied within dl + S_P of its send.

Theorems, each an inductive invariant of the composed model, proven for every
transition (``tau`` real time, ``tg`` the grant, ``th`` P's last applied
heartbeat, ``tsil`` the instant D went silent):

I8   (system ``timing``) while D has not gone silent, the lease is never EXPIRED.
     Strengthening: with ``B`` the real time by which P will apply a heartbeat
     D sent after tracking (``tg + R + max(K, H') + S_D + dl + S_P`` before the
     first, ``tr + H' + S_D + dl + S_P`` after the one applied at ``tr``),
     ``cP + (1+rho)(B - tau) < deadline`` holds throughout.
I5   (every system) with no renewal applied, the lease is not GRANTED at any real
     time ``tau >= tg + L/(1-rho) + S_P``.
I6   (every system) ``GRANTED => tau < max(tg + L/(1-rho), th + E/(1-rho)) + S_P``:
     P frees within ``E/(1-rho) + S_P`` of its last *received* heartbeat (or of
     ``L/(1-rho) + S_P`` after the grant, whichever is later), whatever D does.
     In ``timing-bounded``, where every applied heartbeat is a delivery (within
     dl + S_P) of one D sent, after D goes silent at ``tsil``:
     ``GRANTED => tau < max(tg + L/(1-rho), tsil + dl + S_P + E/(1-rho)) + S_P``.
     (The brief's "E/(1-rho) + S_P + dl of D's last sent one" misses one S_P: P
     applies a heartbeat at its next step, up to S_P after arrival, and the
     extension counts from that step.)
I7   (system ``timing-cap``) ``GRANTED => tau < tg + max(L, C)/(1-rho) + S_P``.
I9   (theorem ``gate drift``) a read the gate admits at local ``now`` happens
     at least ``margin`` before the peer's deadline on the peer's clock: the
     gate widens the kept sample's uncertainty by ``(2rho/(1-rho)) * (now - t0)``
     (``rules.aged_uncertainty``, ``t0`` the local send time of the sample), so
     the margin need not absorb the drift.
I13  (system ``timing-reads``: the composed model plus D's READ, P's handling of
     its transfer-done -- first copy, duplicates, replays -- with any readers
     ``n``, other readers' and replayed transfer-dones, aborts from anywhere, and
     D's use of a read on an OK; T1 and T2 are *not* assumed) P never sends OK
     for, and D never uses, a read that overlapped the end of the lease; and every
     transfer-done P handles is answered OK exactly when the lease is GRANTED.
I11  (every system) in real time: while D steps, a tracked engine's last
     heartbeat is always less than ``H' + S_D`` old, so consecutive heartbeats
     are less than ``H' + S_D`` apart; and (lemma L6) D's first heartbeat naming
     the request leaves within ``max(K, H') + S_D`` of the track.

Without drift (rho = 0) T1 and T2 read ``R + max(K, H) + S_D + dl + S_P < L`` and
``H + S_D + dl + S_P < E``: at the defaults (L=30, E=20, H=5) the steady state
tolerates about 15 s of step and delay in total.

Not proven (and not true): anything without T1/T2 or beyond the bounds; see
:mod:`proofs.counterexamples` for the schedules that break each one. With a cap,
a lease D still tracks is expired at the cap by design (I7), so I8 is proven
without one. Lost heartbeats are not modelled (a loss is a delay beyond dl); the
margin E leaves over H' + S_D + dl + S_P is what absorbs them in practice.
A renewal that assigns ``now + E`` instead of taking the max breaks I8 only
with a heartbeat from outside D's schedule (a stray, as in the counterexample);
whether it holds without strays is not proven here (the max is what the
strengthening L7 relies on).
"""

from __future__ import annotations

from typing import Any

import z3

from leaseproto.core import rules as R

from .invariants import Invariant
from .model import ABSENT, EXPIRED, GRANTED, Theorem, ended
from .timing_model import build
from .timing_state import Options, drift, hq, vmax

__all__ = ["invariants_for", "systems", "theorems"]


def _w(p: Any) -> Any:
    return p.SD + p.dl + p.SP


def next_renewal_by(s: Any, p: Any) -> Any:
    """``B``: by when P applies a heartbeat D sends on its schedule."""
    return z3.If(s.renewed, s.tr + hq(p) + _w(p), s.tg + p.R + vmax(p.K, hq(p)) + _w(p))


def reclaim_by(s: Any, p: Any) -> Any:
    """``X``: by when the lease is due on P's clock, in real time."""
    lo = 1 - p.rho
    granted = s.tg + p.L / lo
    return z3.If(s.hash, vmax(granted, s.th + p.E / lo), granted)


def _steps_and_clocks(s: Any, p: Any) -> Any:
    lo, hi = 1 - p.rho, 1 + p.rho
    return z3.And(
        s.lastP <= s.tau,
        s.tau <= s.lastP + p.SP,
        s.lastDs <= s.tau,
        z3.Implies(z3.Not(s.silent), s.tau <= s.lastDs + p.SD),
        z3.Implies(s.silent, s.tsil <= s.tau),
        z3.Implies(
            s.st != ABSENT,
            z3.And(
                s.tg <= s.tau,
                lo * (s.tau - s.tg) <= s.cP - s.cg,
                s.cP - s.cg <= hi * (s.tau - s.tg),
            ),
        ),
        z3.Implies(s.st == ABSENT, z3.And(z3.Not(s.tracked), z3.Not(s.hash))),
        z3.Implies(s.hash, z3.And(s.tg <= s.th, s.th <= s.tau, s.cP - s.ch >= lo * (s.tau - s.th))),
    )


def _engine(s: Any, p: Any) -> Any:
    lo = 1 - p.rho
    return z3.And(
        z3.Implies(s.tracked, z3.And(s.tg <= s.ttrack, s.ttrack <= s.tau, s.ttrack <= s.tg + p.R)),
        z3.Implies(
            z3.And(z3.Not(s.tracked), z3.Not(s.silent), s.st != ABSENT), s.tau <= s.tg + p.R
        ),
        z3.Implies(
            z3.And(s.tracked, z3.Not(s.conn)),
            z3.And(
                z3.Not(s.hasD), z3.Not(s.out), z3.Implies(z3.Not(s.silent), s.tau <= s.ttrack + p.K)
            ),
        ),
        z3.Implies(s.hasD, z3.And(s.tsD <= s.tau, s.cD - s.lastD >= lo * (s.tau - s.tsD))),
        z3.Implies(
            z3.And(s.tracked, s.hasD),
            z3.And(s.conn, s.tsD <= s.lastDs, lo * (s.lastDs - s.tsD) < p.H),
        ),
        z3.Implies(z3.Not(s.tracked), z3.And(z3.Not(s.out), z3.Not(s.renewed), z3.Not(s.hasO))),
    )


def _in_flight(s: Any, p: Any) -> Any:
    hi = 1 + p.rho
    return z3.And(
        z3.Implies(
            s.out,
            z3.And(
                s.tracked,
                s.hasD,
                s.hasO,
                s.ttrack <= s.tout,
                s.tout <= s.tsD,
                s.tout <= s.tso,
                s.tau <= s.tout + p.dl + p.SP,
            ),
        ),
        z3.Implies(s.hasO, z3.And(s.tracked, s.hasD, s.ttrack <= s.tso, s.tso <= s.tsD)),
        z3.Implies(s.arr, z3.And(s.out, s.tout <= s.tarr, s.tarr <= s.tau)),
        z3.Implies(
            s.renewed,
            z3.And(
                s.tracked, s.hasD, s.tg <= s.tr, s.tr <= s.tau, s.cP - s.cr <= hi * (s.tau - s.tr)
            ),
        ),
        z3.Implies(z3.And(s.renewed, z3.Not(s.out)), s.tsD <= s.tr),
        z3.Implies(z3.And(z3.Not(s.renewed), s.tracked, z3.Not(s.out), s.hasD), s.tsD <= s.ttrack),
    )


def _schedule(s: Any, p: Any) -> Any:
    b = next_renewal_by(s, p)
    return z3.Implies(
        z3.Not(s.silent),
        z3.And(
            z3.Implies(z3.And(s.tracked, s.out), s.tout + p.dl + p.SP <= b),
            z3.Implies(
                z3.And(s.tracked, s.conn, z3.Not(s.out), z3.Not(s.hasD)), s.lastDs + _w(p) <= b
            ),
            z3.Implies(
                z3.And(s.tracked, s.conn, z3.Not(s.out), s.hasD), s.tsD + hq(p) + _w(p) <= b
            ),
            z3.Implies(z3.And(s.tracked, z3.Not(s.conn)), s.ttrack + p.K + _w(p) <= b),
            z3.Implies(s.st != ABSENT, s.tau <= b),
        ),
    )


def _covers(s: Any, p: Any) -> Any:
    hi = 1 + p.rho
    return z3.And(
        z3.Implies(s.st == GRANTED, s.deadline >= s.cg + p.L),
        z3.Implies(z3.And(s.st == GRANTED, s.renewed, z3.Not(s.silent)), s.deadline >= s.cr + p.E),
        z3.Implies(
            z3.And(s.st == GRANTED, z3.Not(s.silent)),
            s.cP + hi * (next_renewal_by(s, p) - s.tau) < s.deadline,
        ),
    )


def _p_clock_bound(s: Any, p: Any) -> Any:
    bound = z3.If(s.hash, vmax(s.cg + p.L, s.ch + p.E), s.cg + p.L)
    return z3.Implies(s.st == GRANTED, s.deadline <= bound)


def _cap_bound(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(s.st != ABSENT, s.cap_at == s.cg + p.C),
        z3.Implies(s.st == GRANTED, s.deadline <= s.cg + vmax(p.L, p.C)),
    )


def _reaped(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s.lastP < reclaim_by(s, p))


def _i6(s: Any, p: Any) -> Any:
    return z3.Implies(s.st == GRANTED, s.tau < reclaim_by(s, p) + p.SP)


def _i5(s: Any, p: Any) -> Any:
    return z3.Implies(
        z3.And(s.st == GRANTED, z3.Not(s.hash)), s.tau < s.tg + p.L / (1 - p.rho) + p.SP
    )


def _i7(s: Any, p: Any) -> Any:
    bound = s.tg + vmax(p.L, p.C) / (1 - p.rho)
    return z3.Implies(s.st == GRANTED, z3.And(s.lastP < bound, s.tau < bound + p.SP))


def _silent_th(s: Any, p: Any) -> Any:
    return z3.And(
        z3.Implies(z3.And(s.silent, s.hasO), s.tso <= s.tsil),
        z3.Implies(z3.And(s.silent, s.hash), s.th <= s.tsil + p.dl + p.SP),
    )


def _i6_silent(s: Any, p: Any) -> Any:
    lo = 1 - p.rho
    bound = vmax(s.tg + p.L / lo, s.tsil + p.dl + p.SP + p.E / lo) + p.SP
    return z3.Implies(z3.And(s.silent, s.st == GRANTED), s.tau < bound)


def _i11(s: Any, p: Any) -> Any:
    return z3.Implies(z3.And(s.tracked, s.hasD, z3.Not(s.silent)), s.tau < s.tsD + hq(p) + p.SD)


def _i8(s: Any, p: Any) -> Any:
    return z3.Implies(z3.Not(s.silent), s.st != EXPIRED)


def _reads(s: Any, p: Any) -> Any:
    return z3.And(
        s.rd >= 0,
        s.rd <= 2,
        s.done >= 0,
        z3.Implies(s.rd == 0, z3.Not(z3.Or(s.rbad, s.okv, s.nkv, s.used))),
        z3.Implies(s.rd == 1, z3.Not(z3.Or(s.rbad, s.okv, s.nkv, s.used))),
        z3.Implies(s.rd >= 1, s.st != ABSENT),
        z3.Implies(s.rbad, ended(s.st)),
    )


def _i13(s: Any, p: Any) -> Any:
    return z3.And(z3.Implies(s.okv, z3.Not(s.rbad)), z3.Implies(s.used, z3.Not(s.rbad)))


def _i13_verdict(s: Any, s2: Any, a: Any, p: Any, *, t: Any, out: Any) -> Any:
    if t.name != "p_td":
        return z3.BoolVal(True)
    return out["ok"] == (s.st == GRANTED)


def _inv(iid: str, system: str, text: str, pred: Any) -> Invariant:
    return Invariant(iid, system, "state", text, pred)


def read_invariants(name: str) -> list[Invariant]:
    """I13 and its lemma, for a system built with ``reads=True``."""
    return [
        _inv("L10", name, "D's read: started after the grant; bad only if the lease ended", _reads),
        _inv(
            "I13",
            name,
            "verified reads: an OK is never sent for, and D never uses, a read that "
            "overlapped the lease's end (any readers n, duplicated or replayed "
            "transfer-dones, aborts)",
            _i13,
        ),
        Invariant(
            "I13",
            name,
            "step",
            "every transfer-done P handles is answered OK exactly when the lease is "
            "live (GRANTED), NK after it ended",
            _i13_verdict,
        ),
    ]


def invariants_for(
    name: str, cap: bool = False, bounded: bool = False, schedule: bool = True
) -> list[Invariant]:
    """The invariants of one composed system."""
    invs = [
        _inv(
            "L1", name, "steps are at most S_P / S_D apart; clocks within drift", _steps_and_clocks
        ),
        _inv(
            "L2",
            name,
            "D's engine: tracked within R, connected within K, never "
            "overdue after a step (I11 in real time)",
            _engine,
        ),
        _inv("L3", name, "the oldest unprocessed heartbeat and the last applied one", _in_flight),
        _inv("L4", name, "P's deadline on its clock: max(cg + L, ch + E)", _p_clock_bound),
        _inv("L5", name, "P's last step came before the lease was due", _reaped),
        _inv(
            "I11",
            name,
            "while D steps, a tracked engine's last heartbeat is always less "
            "than H/(1-rho) + S_D old (real time)",
            _i11,
        ),
        _inv("I5", name, "without renewals the lease is freed by tg + L/(1-rho) + S_P", _i5),
        _inv("I6", name, "the lease is freed by max(tg + L/(1-rho), th + E/(1-rho)) + S_P", _i6),
    ]
    if schedule:
        invs += [
            _inv("L6", name, "D's next heartbeat is applied by B", _schedule),
            _inv("L7", name, "the deadline outlasts B on P's clock", _covers),
            _inv("I8", name, "while D has not gone silent the lease is never EXPIRED", _i8),
        ]
    if cap:
        invs.append(
            _inv("I7", name, "with a cap the lease is freed by tg + max(L, C)/(1-rho) + S_P", _i7)
        )
        invs.append(_inv("L8", name, "cap_at = cg + C; deadline <= cg + max(L, C)", _cap_bound))
    if bounded:
        invs.append(
            _inv(
                "L9",
                name,
                "after silence, P applies no heartbeat later than tsil + dl + S_P",
                _silent_th,
            )
        )
        invs.append(
            _inv(
                "I6",
                name,
                "after D goes silent at tsil, the lease is freed by "
                "max(tg + L/(1-rho), tsil + dl + S_P + E/(1-rho)) + S_P",
                _i6_silent,
            )
        )
    return invs


def systems() -> list[tuple[Any, list[Invariant]]]:
    """The composed systems proven, each with its invariants (built now)."""
    out = []
    for opts, schedule in (
        (Options(), True),
        (Options(cap=True), False),
        (Options(strays="bounded"), False),
    ):
        sys_ = build(opts)
        out.append(
            (
                sys_,
                invariants_for(
                    sys_.name, cap=opts.cap, bounded=opts.strays == "bounded", schedule=schedule
                ),
            )
        )
    # I13 needs no timing assumption: the composed model with reads and verdicts,
    # T1/T2 dropped, any drift, delays and losses (only the read lemma is assumed)
    reads = build(Options(reads=True, assume=frozenset()))
    out.append((reads, read_invariants(reads.name)))
    return out


def gate_admits(peer_at: str = "peer_at_read") -> tuple[Any, dict[str, Any]]:
    """The gate admits a read at local ``now`` (real time ``tau``), with a sample
    ``(t0, T, t1)`` taken at real ``tau_b``, both clocks drifting within ``rho``:
    ``(hypotheses, {name: term})``; ``peer_at`` names the peer's clock at ``tau``."""
    rho, t0, t1, peer_t, now, d, margin = z3.Reals("rho t0 t1 T now remote_deadline margin")
    tau_b, tau, cl_b, cq = z3.Reals(f"tau_b tau local_at_b {peer_at}")
    # local clock reads cl_b at real tau_b (when the peer read T) and now at real tau
    offset, unc = peer_t - (t0 + t1) / 2, (t1 - t0) / 2
    hyps = z3.And(
        rho >= 0,
        rho < 1,
        margin >= 0,
        t0 <= cl_b,
        cl_b <= t1,
        tau_b <= tau,
        t1 <= now,
        drift(cl_b, now, tau - tau_b, rho),
        drift(peer_t, cq, tau - tau_b, rho),
        R.read_allowed(d, now, offset, R.aged_uncertainty(unc, now - t0, rho), margin),
    )
    names = {"rho": rho, "t0": t0, "t1": t1, "T": peer_t, "now": now, "remote_deadline": d}
    names.update({"margin": margin, "tau": tau, "local_at_b": cl_b, "peer_at": cq})
    return hyps, names


def theorems() -> list[Theorem]:
    """I9 with drift: the gate, which ages the sample's uncertainty, stays sound."""
    hyps, v = gate_admits()
    rho, t0, t1, peer_t, now = v["rho"], v["t0"], v["t1"], v["T"], v["now"]
    d, margin, cl_b, cq = v["remote_deadline"], v["margin"], v["local_at_b"], v["peer_at"]
    show = {
        "rho": rho,
        "t0": t0,
        "t1": t1,
        "peer_read_T": peer_t,
        "local_then": cl_b,
        "now": now,
        "peer_clock_at_read": cq,
        "remote_deadline": d,
        "margin": margin,
    }
    return [
        Theorem(
            "I9",
            "gate",
            "gate drift",
            "read_allowed with the uncertainty aged by (2 rho/(1-rho)) (now - t0) => "
            "the peer's clock at the read is at least margin before its deadline",
            hyps,
            cq + margin < d,
            show,
        )
    ]
