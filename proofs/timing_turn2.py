"""The lease in the other direction (spec §2.8): D grants, P renews and verifies.

A turn-2 prefix read (D's cached lease, ``decoder_kv_blocks_ttl``) and a push
registration (D's registration lease, ``push_registration_timeout``) are the P->D
lease with the roles swapped: the grantor is D's ``LeaseTable`` (the same rules),
the renewer and verifier is P. Each theorem below is stated in real time with
both clocks free (any offset) and drifting within ``[1-rho, 1+rho]``; the rules
are :mod:`leaseproto.core.rules` evaluated on z3 terms.

I16  (``turn2 first heartbeat``, ``turn2 steady state``) the mirrored T1/T2: P's
     first heartbeat for a turn-2 request, and each next one, is handled by D
     while D's cached lease is live, so it renews (``renew_applies``) and D's
     reaper has not found it due (``expire_due``).
I14  (``turn2 fence``) P uses a prefix read only after ``OK`` from D
     (``transfer_verdict_ok`` of the state D handled the transfer-done in); NIXL
     delivers the transfer-done after the READ completed, and D frees the blocks
     only at the release (ended states are absorbing, I2): a used read completed
     before D freed, so before any reuse. No timing assumption, any offset/drift.
I14  (``turn2 gate-only``, a naive variant, expected SAT) P uses a read the
     gate (I9, with the aged uncertainty) admitted, without a verdict: z3 finds a
     schedule (P pauses after the gate) in which the READ completes after D
     reused the blocks. I9 is a gate; I14 is the fence.
I15  (``push fence``) D uses pushed KV only on P's completion handled while the
     registration lease was live: the WRITE completed before D freed.
I15  (``push quarantine``) a lapsed registration's blocks are handed out again
     only after P's completion/abort was handled, P's agent was forgotten, or a
     bound ``stale`` after the lapse: a WRITE that completes before P's agent is
     forgotten and within ``stale`` of the lapse never lands in reused blocks.
     (``push watchdog-only``, expected SAT: with the stock one-shot watchdog,
     reuse after the lapse alone, a late WRITE lands in reused blocks.)
     Residual risk, not removable by D: a WRITE completing after D forgot P's
     agent (P partitioned, not dead), or later than ``stale`` after the lapse
     (P connected but stalled that long), may land in reused blocks.
"""

from __future__ import annotations

from typing import Any

import z3

from leaseproto.core import rules as R

from .model import EXPIRED, GRANTED, Theorem
from .timing import gate_admits
from .timing_state import drift

__all__ = ["naive_refutations", "theorems"]


def _pos(*xs: Any) -> Any:
    return z3.And(*(x > 0 for x in xs))


def _state_at(t: Any, t_free: Any) -> Any:
    """The grantor's lease state at real time ``t``: GRANTED until the release at
    ``t_free``, ended afterwards (absorbing, I2; blocks freed only at the release)."""
    return z3.If(t < t_free, GRANTED, EXPIRED)


def _i16_first() -> Theorem:
    rho, ttl, rq, k, h, sp, dl, sd = z3.Reals("rho ttl Rq K H S_P dl S_D")
    tg, th, cg, ch = z3.Reals("tg th d_clock_grant d_clock_handle")
    hp = h / (1 - rho)
    first = rq + z3.If(k > hp, k, hp) + sp + dl + sd
    hyps = z3.And(
        rho >= 0,
        rho < 1,
        _pos(ttl, rq, k, h, sp, dl, sd),
        first < ttl / (1 + rho),  # T1 mirrored (spec §2.8)
        tg <= th,
        th <= tg + first,
        drift(cg, ch, th - tg, rho),
    )
    deadline = R.grant_deadline(cg, ttl)
    goal = z3.And(
        R.renew_applies(GRANTED, deadline, ch), z3.Not(R.expire_due(GRANTED, deadline, ch))
    )
    show = {"rho": rho, "ttl": ttl, "Rq": rq, "d_grant": cg, "d_handle": ch}
    return Theorem(
        "I16",
        "turn2",
        "turn2 first heartbeat",
        "T1 mirrored: P's first heartbeat for a turn-2 request is handled by D while "
        "the cached lease (decoder_kv_blocks_ttl) is live, and renews it",
        hyps,
        goal,
        show,
    )


def _i16_step() -> Theorem:
    rho, e, h, sp, dl, sd = z3.Reals("rho E H S_P dl S_D")
    t1, t2, c1, c2, d0 = z3.Reals("th1 th2 d_clock_1 d_clock_2 deadline_before")
    step = h / (1 - rho) + sp + dl + sd
    hyps = z3.And(
        rho >= 0,
        rho < 1,
        _pos(e, h, sp, dl, sd),
        step < e / (1 + rho),  # T2 mirrored
        c1 < d0,  # the lease was live at the renewal handled at th1
        t1 <= t2,
        t2 <= t1 + step,
        drift(c1, c2, t2 - t1, rho),
    )
    deadline = R.renew_deadline(GRANTED, d0, None, c1, e)
    goal = z3.And(
        R.renew_applies(GRANTED, deadline, c2), z3.Not(R.expire_due(GRANTED, deadline, c2))
    )
    show = {"rho": rho, "E": e, "d_clock_1": c1, "d_clock_2": c2}
    return Theorem(
        "I16",
        "turn2",
        "turn2 steady state",
        "T2 mirrored: P's next heartbeat (or its transfer-done) is handled by D within "
        "H/(1-rho) + S_P + dl + S_D of the last renewal, before the lease is due",
        hyps,
        goal,
        show,
    )


def _fence(iid: str, system: str, name: str, what: str) -> Theorem:
    """``what`` (a READ or a WRITE) completed at ``t_done``; the grantor handled its
    notification at ``t_handle >= t_done`` and frees at ``t_free``; reuse after."""
    t_done, t_handle, t_free, t_reuse = z3.Reals("t_done t_handle t_free t_reuse")
    hyps = z3.And(t_done <= t_handle, t_free <= t_reuse)
    used = R.transfer_verdict_ok(_state_at(t_handle, t_free))
    goal = z3.Implies(used, t_done < t_reuse)
    show = {"t_done": t_done, "t_handle": t_handle, "t_free": t_free, "t_reuse": t_reuse}
    return Theorem(
        iid,
        system,
        name,
        f"the {what} is used only after OK, so it completed before the grantor freed "
        "(and before any reuse), whatever the clocks",
        hyps,
        goal,
        show,
    )


def _quarantine(naive: bool) -> Theorem:
    """Push: P's WRITE completes at ``wc``; D handles its completion at ``tc``;
    D forgets P's agent at ``tf_agent``; D's registration lapses at ``t_free``;
    ``stale``: D's bound on a quarantine (the vLLM connector's
    ``max(10 kv_lease_duration, max_lease_lifetime)``)."""
    wc, tc, t_free, t_agent, t_reuse, stale = z3.Reals(
        "write_done completion_handled t_lapse t_forget t_reuse stale"
    )
    rules = [wc <= tc, t_free <= t_reuse, stale > 0]
    if not naive:  # quarantine until the completion/abort, the agent forgotten, or the bound
        rules.append(z3.Or(tc <= t_reuse, t_agent <= t_reuse, t_free + stale <= t_reuse))
    hyps = z3.And(*rules)
    goal = z3.Implies(z3.And(wc < t_agent, wc < t_free + stale), wc <= t_reuse)
    show = {"write_done": wc, "completion": tc, "t_lapse": t_free, "t_reuse": t_reuse}
    return Theorem(
        "I15",
        "push",
        "push watchdog-only" if naive else "push quarantine",
        "a WRITE completing before D forgets P's agent (and within the quarantine's bound "
        "after the lapse) never lands in blocks D handed to another request",
        hyps,
        goal,
        show,
    )


def _gate_only() -> Theorem:
    """Turn 2, gate only (vLLM's design): the gate admits at P's ``now``, P pauses
    ``pause`` then the READ takes ``rd``; D frees at its first step with its clock
    at or past the deadline (``expire_due``) and reuses after."""
    gate, v = gate_admits("peer_at_gate")
    rho, tau, cq, d = v["rho"], v["tau"], v["peer_at"], v["remote_deadline"]
    pause, rd, t_free, c_free, t_reuse = z3.Reals("pause read_s t_free d_clock_free t_reuse")
    hyps = z3.And(
        gate,
        pause >= 0,
        rd >= 0,
        tau <= t_free,
        drift(cq, c_free, t_free - tau, rho),
        R.expire_due(GRANTED, d, c_free),
        t_free <= t_reuse,
    )
    goal = tau + pause + rd < t_reuse  # gate-only: the read is used, no verdict
    show = {"now": v["now"], "remote_deadline": d, "margin": v["margin"], "pause": pause}
    show["t_reuse"] = t_reuse
    return Theorem(
        "I14",
        "turn2",
        "turn2 gate-only",
        "a read the gate admits completes before D reuses the blocks (false: P may "
        "pause after the gate)",
        hyps,
        goal,
        show,
    )


def theorems() -> list[Theorem]:
    """The proven obligations of the mirrored lease (hypotheses sat, goal valid)."""
    return [
        _i16_first(),
        _i16_step(),
        _fence("I14", "turn2", "turn2 fence", "prefix READ"),
        _fence("I15", "push", "push fence", "pushed WRITE"),
        _quarantine(naive=False),
    ]


def naive_refutations() -> list[Theorem]:
    """Naive variants whose goal z3 must refute (a counterexample must exist)."""
    return [_gate_only(), _quarantine(naive=True)]
