"""The composed model of P and D in real time (what it proves: :mod:`proofs.timing`).

State: real time ``tau``; three clocks read at ``tau`` — P's ``cP``, D's ``cD``
and, for the naive two-clock variant only, a P worker's ``cW`` — each running
at a rate within ``[1 - rho, 1 + rho]`` of real time with any offset; one lease
on P (its deadline and fields on P's clock, updated by :mod:`leaseproto.core.rules`);
D's tracking of the request and the state of its P engine in D's
``HeartbeatTracker`` (D's clock); the oldest heartbeat D sent that P has not
processed (``out``, sent at real ``tout``); ghosts for the last processed
heartbeat from D's schedule (``renewed``/``cr``/``tr``), the last applied
renewal from any source (``hash``/``ch``/``th``) and D's last send naming the
request (``hasO``/``tso``).

Transitions (each instantaneous at ``tau``):

``grant``       P grants at ``cP`` (``grant_deadline``).
``track``       D starts tracking (router transit ``R`` after the grant); its
                engine may already be connected and heartbeating other
                requests, in any state D's schedule allows.
``handshake``   D's engine connects (``K`` after the track).
``d_step``      D's ``due``: sends when tracked, connected and never sent or
                ``heartbeat_due`` on ``cD``.
``p_step``      P's reaper at ``cP`` (``expire_state``).
``arrive``      the oldest unprocessed heartbeat reaches P's inbox, within ``dl``
                of its send (``arr``, at real ``tarr``).
``p_recv``      P's step handles the heartbeat that arrived (``renew_deadline``
                at ``cP``), before its ``expire``: a step never runs with an
                arrived heartbeat left unhandled (``p_step`` and a busy
                ``advance`` need ``not arr``); so it is handled within ``dl + SP``
                of its send.
``p_stray``     P applies any other heartbeat naming the request: duplicates,
                old or reordered ones, or one from a decode instance that no
                longer needs it (with ``strays="bounded"`` only a delivery, within
                ``dl + SP``, of a heartbeat D sent). Dropping the delivery
                obligation of every heartbeat but the oldest unprocessed one is
                sound: an obligation only removes behaviours.
``d_stop``      D goes silent for this request (crashed, or no longer needs it).
``read_start``  D starts its RDMA READ of the blocks (any time after the grant:
                D may be stalled past the deadline).
``read_end``    the READ completes; its bytes are good exactly when the lease had
                not ended by then (ended states are absorbing, so "ended at any
                instant of the read" is "ended at its end": ghost ``rbad``).
                NIXL delivers the READ's transfer-done only after this.
``p_td``        P handles a transfer-done of *this* read -- the first copy or a
                duplicated / replayed one, any number of times -- carrying any
                ``n >= 1`` readers (``transfer_done_state`` with ``n``), and sends
                the verdict ``transfer_verdict_ok`` to D (ghosts ``okv``/``nkv``:
                an OK / NK for this read was sent).
``p_td_other``  P handles any other transfer-done naming the request: the other
                D ranks' (multiple readers), replays of them, forged ones; any ``n``.
``p_abort``     P handles an abort naming the request, from anywhere.
``d_use``       D uses what it read (emits a token from it) on an OK verdict for
                this read (ghost ``used``).
``advance``     real time passes by ``dt``; each side either steps throughout
                with no effect (``p_busy``/``d_busy``: a run of steps that expire
                nothing / send nothing, which by monotone clocks is checked at the
                end) or does not step, within its bound ``SP``/``SD``; time cannot
                pass an obligation (a delivery, the handshake, the router transit).
"""

from __future__ import annotations

from typing import Any

import z3

from leaseproto.core import rules as R
from leaseproto.core.state import Input

from .kit import Bool, Int, Real, System, Transition
from .model import ABORTED, ABSENT, EXPIRED, GRANTED, TRANSFERRED, allowed, ended, release_fired
from .timing_state import FIELDS, READ_FIELDS, Options, drift, t1, t2

#: the options of :func:`build` when none are given (T1 and T2 assumed, one lease, no reads)
DEFAULT = Options()


def build(opts: Options = DEFAULT) -> System:
    params = {n: Real for n in ("H", "E", "L", "R", "K", "SD", "SP", "dl", "rho")}
    if opts.cap:
        params["C"] = Real
    params.update({f"{b}_act": Real for b in opts.actual})

    def act(p: Any, name: str) -> Any:
        return p[f"{name}_act"] if name in opts.actual else p[name]

    def axioms(p: Any) -> Any:
        ax = [
            p.H > 0,
            p.E > 0,
            p.L > 0,
            p.R >= 0,
            p.K >= 0,
            p.SD > 0,
            p.SP > 0,
            p.dl >= 0,
            p.rho >= 0,
            p.rho < 1,
        ]
        if opts.cap:
            ax.append(p.C > 0)
        for b in opts.actual:
            ax += [p[f"{b}_act"] >= 0] + ([p.rho_act < 1] if b == "rho" else [])
        if "T1" in opts.assume:
            ax.append(t1(p))
        if "T2" in opts.assume:
            ax.append(t2(p))
        return z3.And(*ax)

    def init(s: Any, p: Any) -> Any:
        return z3.And(
            s.st == ABSENT,
            z3.Not(s.tracked),
            z3.Not(s.conn),
            z3.Not(s.silent),
            z3.Not(s.hasD),
            z3.Not(s.hasO),
            z3.Not(s.out),
            z3.Not(s.arr),
            z3.Not(s.renewed),
            z3.Not(s.hash),
            s.lastP == s.tau,
            s.lastDs == s.tau,
            *(
                (s.done == 0, s.rd == 0, *(z3.Not(s[f]) for f in ("rbad", "okv", "nkv", "used")))
                if opts.reads
                else ()
            ),
        )

    def reaper_clock(s: Any) -> Any:
        return s.cW if opts.naive == "two_clocks" else s.cP

    def renew(s: Any, p: Any) -> tuple[Any, dict[str, Any]]:
        c = s.cP
        applies = R.renew_applies(s.st, s.deadline, c)
        if opts.naive == "assign":  # the naive variant: deadline = now + extension
            new_deadline = z3.If(applies, c + p.E, s.deadline)
        else:
            new_deadline = R.renew_deadline(
                s.st, s.deadline, s.cap_at if opts.cap else None, c, p.E
            )
        return applies, {
            "st": R.next_state(s.st, Input.RECV_HEARTBEAT, applies),
            "deadline": new_deadline,
            "hash": z3.Or(s.hash, applies),
            "ch": z3.If(applies, c, s.ch),
            "th": z3.If(applies, s.tau, s.th),
        }

    def would_send(s: Any, p: Any, c: Any) -> Any:
        return z3.And(s.tracked, s.conn, z3.Or(z3.Not(s.hasD), R.heartbeat_due(s.lastD, c, p.H)))

    def grant(s: Any, a: Any, p: Any) -> dict[str, Any]:
        u = {
            "st": R.next_state(s.st, Input.GRANT, True),
            "deadline": R.grant_deadline(s.cP, p.L),
            "cg": s.cP,
            "tg": s.tau,
        }
        if opts.reads:
            u["done"] = 0
        if opts.cap:
            u["cap_at"] = s.cP + p.C
        return u

    def ends(s: Any, st2: Any) -> dict[str, Any]:
        return {"st": st2, "tend": z3.If(release_fired(s.st, st2), s.tau, s.tend)}

    def transfer(s: Any, a: Any) -> dict[str, Any]:
        u = ends(s, R.transfer_done_state(s.st, s.done, a.n))
        u["done"] = R.transfer_done_count(s.st, s.done)
        return u

    def p_td(s: Any, a: Any, p: Any) -> dict[str, Any]:
        ok = R.transfer_verdict_ok(s.st)  # decided on the state P handles it in
        u = transfer(s, a)
        u.update(okv=z3.Or(s.okv, ok), nkv=z3.Or(s.nkv, z3.Not(ok)))
        return u

    def track_guard(s: Any, a: Any, p: Any) -> Any:
        lo = 1 - act(p, "rho")
        engine_ok = z3.Implies(
            a.hasD0,
            z3.And(
                a.conn0,
                a.tsD0 <= s.lastDs,
                lo * (s.lastDs - a.tsD0) < p.H,
                s.cD - a.lastD0 >= lo * (s.tau - a.tsD0),
            ),
        )
        return z3.And(z3.Not(s.tracked), z3.Not(s.silent), s.st != ABSENT, engine_ok)

    def d_step(s: Any, a: Any, p: Any) -> dict[str, Any]:
        sent = would_send(s, p, s.cD)
        return {
            "lastDs": s.tau,
            "hasD": z3.Or(s.hasD, sent),
            "lastD": z3.If(sent, s.cD, s.lastD),
            "tsD": z3.If(sent, s.tau, s.tsD),
            "hasO": z3.Or(s.hasO, sent),
            "tso": z3.If(sent, s.tau, s.tso),
            "out": z3.Or(s.out, sent),
            "tout": z3.If(z3.And(sent, z3.Not(s.out)), s.tau, s.tout),
        }

    def p_step(s: Any, a: Any, p: Any) -> dict[str, Any]:
        st2 = R.expire_state(s.st, s.deadline, reaper_clock(s))
        return {"lastP": s.tau, "st": st2, "tend": z3.If(release_fired(s.st, st2), s.tau, s.tend)}

    def p_recv(s: Any, a: Any, p: Any) -> dict[str, Any]:
        _, u = renew(s, p)
        u.update(out=False, arr=False, renewed=True, cr=s.cP, tr=s.tau)
        return u

    def stray_guard(s: Any, a: Any, p: Any) -> Any:
        if opts.strays == "bounded":
            return z3.And(s.hasO, s.tau <= s.tso + act(p, "dl") + act(p, "SP"))
        return z3.BoolVal(opts.strays == "free")

    def adv_guard(s: Any, a: Any, p: Any) -> Any:
        t2_ = s.tau + a.dt
        rho = act(p, "rho")
        not_silent = z3.Not(s.silent)
        return z3.And(
            a.dt > 0,
            drift(s.cP, a.cP2, a.dt, rho),
            drift(s.cD, a.cD2, a.dt, rho),
            drift(s.cW, a.cW2, a.dt, rho),
            *(
                (
                    z3.Implies(s.arr, z3.Not(a.p_busy)),  # a stepping P handles what arrived
                    z3.Implies(z3.And(s.out, z3.Not(s.arr)), t2_ <= s.tout + act(p, "dl")),
                )
                if opts.arrivals
                else ()
            ),
            z3.If(
                a.p_busy,
                z3.Not(
                    R.expire_due(s.st, s.deadline, a.cW2 if opts.naive == "two_clocks" else a.cP2)
                ),
                t2_ <= s.lastP + act(p, "SP"),
            ),
            z3.Implies(a.d_busy, z3.And(not_silent, z3.Not(would_send(s, p, a.cD2)))),
            z3.Implies(z3.And(z3.Not(a.d_busy), not_silent), t2_ <= s.lastDs + act(p, "SD")),
            z3.Implies(s.out, t2_ <= s.tout + act(p, "dl") + act(p, "SP")),
            z3.Implies(
                z3.And(s.tracked, z3.Not(s.conn), not_silent), t2_ <= s.ttrack + act(p, "K")
            ),
            z3.Implies(
                z3.And(s.st != ABSENT, z3.Not(s.tracked), not_silent), t2_ <= s.tg + act(p, "R")
            ),
        )

    def advance(s: Any, a: Any, p: Any) -> dict[str, Any]:
        t2_ = s.tau + a.dt
        return {
            "tau": t2_,
            "cP": a.cP2,
            "cD": a.cD2,
            "cW": a.cW2,
            "lastP": z3.If(a.p_busy, t2_, s.lastP),
            "lastDs": z3.If(a.d_busy, t2_, s.lastDs),
        }

    transitions = [
        Transition(
            "grant",
            "P grants the lease",
            {},
            lambda s, a, p: allowed(s.st, Input.GRANT),
            grant,
            witness=lambda s, s2, a, p: z3.And(s.st == ABSENT, s2.st == GRANTED),
        ),
        Transition(
            "track",
            "D starts tracking the request",
            {"conn0": Bool, "hasD0": Bool, "lastD0": Real, "tsD0": Real},
            track_guard,
            lambda s, a, p: {
                "tracked": True,
                "ttrack": s.tau,
                "conn": a.conn0,
                "hasD": a.hasD0,
                "lastD": a.lastD0,
                "tsD": a.tsD0,
                "out": False,
                "arr": False,
                "hasO": False,
            },
            witness=lambda s, s2, a, p: a.hasD0,
        ),
        Transition(
            "handshake",
            "D's engine connects",
            {},
            lambda s, a, p: z3.And(s.tracked, z3.Not(s.conn)),
            lambda s, a, p: {"conn": True},
        ),
        Transition(
            "d_step",
            "D steps (due)",
            {},
            lambda s, a, p: z3.Not(s.silent),
            d_step,
            witness=lambda s, s2, a, p: z3.And(s.hasD, s2.tsD == s.tau, s.tsD < s.tau),
            outputs=lambda s, a, p: {"sent": would_send(s, p, s.cD)},
        ),
        Transition(
            "p_step",
            "P steps (expire)",
            {},
            lambda s, a, p: z3.Not(s.arr) if opts.arrivals else z3.BoolVal(True),
            p_step,
            witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.st == EXPIRED),
        ),
        Transition(
            "arrive",
            "D's oldest unprocessed heartbeat arrives at P",
            {},
            lambda s, a, p: z3.And(s.out, z3.Not(s.arr), s.tau <= s.tout + act(p, "dl")),
            lambda s, a, p: {"arr": True, "tarr": s.tau},
            witness=lambda s, s2, a, p: s.tau > s.tout,
        ),
        Transition(
            "p_recv",
            "P's step handles the heartbeat that arrived",
            {},
            lambda s, a, p: s.arr if opts.arrivals else s.out,
            p_recv,
            witness=lambda s, s2, a, p: s2.deadline > s.deadline,
        ),
        Transition(
            "p_stray",
            "P applies another heartbeat naming the request",
            {},
            stray_guard,
            lambda s, a, p: renew(s, p)[1],
            witness=lambda s, s2, a, p: s2.deadline > s.deadline,
        ),
        Transition(
            "d_stop",
            "D goes silent",
            {},
            lambda s, a, p: z3.Not(s.silent),
            lambda s, a, p: {"silent": True, "tsil": s.tau},
        ),
        Transition(
            "advance",
            "real time passes",
            {"dt": Real, "cP2": Real, "cD2": Real, "cW2": Real, "p_busy": Bool, "d_busy": Bool},
            adv_guard,
            advance,
            witness=lambda s, s2, a, p: z3.And(a.p_busy, a.d_busy, s.tracked),
        ),
    ]
    if opts.reads:
        transitions += [
            Transition(
                "read_start",
                "D starts reading the blocks",
                {},
                lambda s, a, p: z3.And(s.rd == 0, s.st != ABSENT),
                lambda s, a, p: {"rd": 1},
            ),
            Transition(
                "read_end",
                "D's READ completes",
                {},
                lambda s, a, p: s.rd == 1,
                lambda s, a, p: {"rd": 2, "rbad": ended(s.st)},
                witness=lambda s, s2, a, p: s2.rbad,
            ),
            Transition(
                "p_td",
                "P handles a transfer-done of this read (or a duplicate) and answers it",
                {"n": Int},
                lambda s, a, p: z3.And(s.rd == 2, a.n >= 1),
                p_td,
                witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.st == GRANTED, a.n > 1),
                outputs=lambda s, a, p: {"ok": R.transfer_verdict_ok(s.st)},
            ),
            Transition(
                "p_td_other",
                "P handles another reader's (or a replayed) transfer-done",
                {"n": Int},
                lambda s, a, p: z3.And(s.st != ABSENT, a.n >= 1),
                lambda s, a, p: transfer(s, a),
                witness=lambda s, s2, a, p: z3.And(s.st == GRANTED, s2.st == TRANSFERRED),
            ),
            Transition(
                "p_abort",
                "P handles an abort naming the request",
                {},
                lambda s, a, p: s.st != ABSENT,
                lambda s, a, p: ends(s, R.abort_state(s.st)),
                witness=lambda s, s2, a, p: s2.st == ABORTED,
            ),
            Transition(
                "d_use",
                "D uses what it read, on an OK verdict",
                {},
                lambda s, a, p: z3.And(s.rd == 2, s.okv),
                lambda s, a, p: {"used": True},
                witness=lambda s, s2, a, p: s2.used,
            ),
        ]
    name = (
        "timing"
        + ("-cap" if opts.cap else "")
        + ("-bounded" if opts.strays == "bounded" else "")
        + ("-reads" if opts.reads else "")
    )
    if opts.naive:
        name += f"-naive-{opts.naive}"
    fields = {**FIELDS, **(READ_FIELDS if opts.reads else {})}
    return System(name, "P and D in real time", fields, params, axioms, init, transitions)
