"""The timing theorems: P and D composed, in real time, with delays and drift.

Symbols (team brief): H heartbeat_interval, E lease_extension, L the lease's
initial ttl (kv_lease_duration), C max_lease_lifetime, S_D / S_P the longest
gap between two lease steps of D / P, dl (the brief's delta) the one-way
notification delay bound, K the handshake bound, R the router transit (P's grant to D's track), rho
the clock-rate drift bound (every clock runs at a rate within [1-rho, 1+rho] of real
time, with any offset: each side measures only durations on its own clock). All
are real-valued unknowns; the proofs hold for every value satisfying the stated
inequalities. The model is :mod:`proofs.timing_model`; P's and D's rules in it
are :mod:`leaseproto.core.rules` evaluated on z3 terms. The invariants below, as
predicates on the model's state, are :mod:`proofs.timing_invariants`.

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
from .model import Theorem
from .timing_invariants import invariants_for, read_invariants
from .timing_model import build
from .timing_state import Options, drift

__all__ = ["invariants_for", "systems", "theorems"]


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
