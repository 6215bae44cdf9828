"""The spec's invariants (§9), judged on the real objects against the ghosts.

Each check raises :class:`~.world.Violation` with the invariant's id. Checks that
need the step itself (a renewal's before/after, a release, a verdict) are called
by :class:`~.world.World` as the step happens; :func:`check_state` runs after
every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import wire
from ..core.events import Release, ReleaseReason
from .ghosts import Violation

if TYPE_CHECKING:
    from ..core.table import LeaseTable
    from .ghosts import Action, Instance

#: a :class:`~.world.World` (not imported: the world imports this module)
World_ = Any

__all__ = [
    "INVARIANTS",
    "check_reaped",
    "check_release",
    "check_renewal",
    "check_schedule",
    "check_state",
    "check_use",
    "check_verdict",
    "check_wake",
    "tombstone_owed",
]

#: What the checker checks, by spec id (spec §9, "Coverage").
INVARIANTS = {
    "I1": "a renewal never shortens a live lease",
    "I2": "a lease is live on P exactly when its ghost instance is (no revival; "
    "an abort staged before the grant ends it at the grant); a heartbeat never moves a "
    "deadline that had passed",
    "I3": "every grant is released exactly once (one Release per instance)",
    "I4": "after P's reap at now, no live lease has deadline <= now; the next_deadline() P "
    "wakes at is the earliest live deadline",
    "I5": "bounded liveness: a lease P never renewed is released by granted_at + ttl",
    "I6": "bounded liveness: a lease is released by max(granted_at + ttl, h + lease_extension), "
    "h P's last heartbeat naming it; its deadline never lies past that bound, and a heartbeat "
    "never renews past max(deadline, min(now + E, granted_at + C))",
    "I7": "with a cap C, no lease is held past granted_at + max(ttl, C), nor renewed past "
    "granted_at + C",
    "I8": "under §5's bounds, no lease of a request D tracks expires (before its cap); a "
    "heartbeat renews a live lease to the full max(deadline, min(now + E, granted_at + C))",
    "I9": "the read gate admits a read only margin before the lease's deadline, "
    "whatever the handshake's round trip (ClockOffset; scope gate)",
    "I10": "a lease is released TRANSFERRED only after `readers` transfer-dones, "
    "and is released once they all arrived (staged ones included)",
    "I11": "after D's step every tracked engine not pending had a heartbeat less "
    "than heartbeat_interval ago",
    "I12": "P never expires a lease before its deadline",
    "I13": "a transfer-done is answered OK exactly when its lease was live; an NK names "
    "how the lease ended while P must remember it; D uses a read only if its blocks "
    "were held; LL only for leases lost untransferred",
    "I14": "turn 2 (scope turn2): I13 for D's cached lease -- P uses a prefix only after "
    "OK from every D rank, each answered while the lease was live; NK or LL: P recomputes",
    "I15": "push (scope push): I13 for D's registration lease -- each completion answered OK "
    "exactly when the registration was live; D uses pushed KV only once every writer's WRITE "
    "landed in the held blocks and each completion was answered OK, decides once, returns a "
    "registration's blocks to its pool only after its lease ended and each writer's completion "
    "or abort was handled or its agent forgotten, no WRITE lands in reused blocks, and a "
    "quarantine waits only for a writer that can still act (B9)",
    "I16": "turn 2 and push (scopes turn2, push): I5, I6, I8 and I11 for D's cached lease or "
    "registration -- P's heartbeats to D on schedule (in push on P's own drifting clock), the "
    "lease never expires while P tracks it, and D frees it by max(granted_at + ttl, h + "
    "lease_extension)",
    "I17": "a request the router gave up on leaves nothing held (scope giveup): after the "
    "router's aborts, no P rank it can reach holds the request's lease and D no longer tracks "
    "it (unless D is gone: the leases lapse, I5/I6)",
}


def _live_ids(table: LeaseTable) -> set[str]:
    return set(table.live())


def check_state(w: World_, act: Action) -> None:
    """After every step: P's live leases are the ghost's live instances (I2, I3)."""
    for p in w.P:
        real = _live_ids(w.tables[p])
        ghost = {r for r in w.R if w.live_inst(p, r) is not None}
        for r in sorted(real - ghost):
            raise Violation("I2", f"{r} is live on {p}, but its lease had ended")
        for r in sorted(ghost - real):
            raise Violation("I3", f"{r} left {p}'s table without a Release")


def check_release(w: World_, p: str, r: str, inst: Instance, rel: Release) -> None:
    if rel.reason is ReleaseReason.TRANSFERRED and inst.tds < len(w.D):
        raise Violation(
            "I10", f"{r} on {p} released TRANSFERRED after {inst.tds} of {len(w.D)} readers"
        )
    if rel.reason is ReleaseReason.EXPIRED:
        if rel.deadline > rel.at:
            raise Violation("I12", f"{r} on {p} expired at {rel.at}, before its deadline")
        cap = w.cfg.max_lease_lifetime
        capped = cap is not None and rel.at >= inst.granted_at + cap
        if not w.broken and w.phase.get(r) == "tracked" and len(w.inst[(p, r)]) == 1 and not capped:
            raise Violation("I8", f"{r} on {p} expired at {rel.at} while D tracked it")


def check_reaped(w: World_, p: str) -> None:
    table = w.tables[p]
    ext = w.cfg.lease_extension
    ttl = w.ttl
    for r in table.live():
        info = table.lease_info(r)
        assert info is not None
        deadline, granted, last = info["deadline"], info["granted_at"], info["last_renewal"]
        assert isinstance(deadline, float) and isinstance(granted, float)
        if deadline <= w.now:
            raise Violation(
                "I4", f"{r} still live on {p} after the reap at {w.now} (deadline {deadline})"
            )
        bound = max(granted + ttl, (last if isinstance(last, float) else granted) + ext)
        if deadline > bound:
            inst = w.live_inst(p, r)
            never = last is None and inst is not None and inst.renewed_at is None
            what = "never renewed, " if never else ""
            raise Violation(
                "I5" if never else "I6", f"{r} on {p}: {what}deadline {deadline} past {bound}"
            )
        check_bounds(w, p, r)


def check_wake(w: World_, p: str, wake: float | None) -> None:
    """I4 in time: P's loop sleeps until ``next_deadline()``, so it must be the
    earliest deadline of a live lease (the deadline queue agrees with the leases,
    compaction and lazy requeues included), or None with no live lease."""
    table = w.tables[p]
    want = min((d for r in table.live() if (d := table.deadline(r)) is not None), default=None)
    if wake != want:
        raise Violation(
            "I4", f"{p}'s next_deadline() is {wake} at {w.now}, its earliest live deadline {want}"
        )


def check_bounds(w: World_, p: str, r: str) -> None:
    """I5-I7 against the ghosts (when P granted the lease, when P last applied a
    heartbeat naming it), not the table's own record: after P's reap at ``now``,
    a lease still live has not outlived its bound."""
    inst = w.live_inst(p, r)
    assert inst is not None
    cfg = w.cfg
    ttl, ext, cap = w.ttl, cfg.lease_extension, cfg.max_lease_lifetime
    g, h = inst.granted_at, inst.renewed_at
    if h is None and w.now >= g + ttl:
        raise Violation("I5", f"{r} on {p}, granted at {g} and never renewed, live at {w.now}")
    if h is not None and w.now >= max(g + ttl, h + ext):
        raise Violation("I6", f"{r} on {p}, granted at {g}, last heartbeat at {h}, live at {w.now}")
    if cap is not None and w.now >= g + max(ttl, cap):
        raise Violation("I7", f"{r} on {p}, granted at {g}, cap {cap}, live at {w.now}")


def check_renewal(w: World_, p: str, before: dict[str, float | None], lost: list[str]) -> None:
    """One heartbeat P handled at ``now``, against the spec's renewal (§8.2, §9.2),
    computed here from the ghosts, not by the core's rules: a lease whose deadline
    had passed (``deadline <= now``: lapsed, to be reaped) keeps it (I2: no renewal
    revives a lease); a live one moves to exactly ``max(deadline, min(now + E,
    granted_at + C))``: never back (I1), never past it (I6; I7 past the cap), and
    never short of it (I8: §5's T2 counts on the full extension)."""
    table = w.tables[p]
    now = float(w.now)
    ext, cap = w.cfg.lease_extension, w.cfg.max_lease_lifetime
    for r, old in before.items():
        new = table.deadline(r)
        if old is None or new is None:
            continue  # created or dropped by a heartbeat: check_state names it (I2, I3)
        if new < old:
            raise Violation("I1", f"a heartbeat moved {r}'s deadline on {p} from {old} to {new}")
        if old <= now:
            if new != old:
                raise Violation(
                    "I2", f"a heartbeat at {now} moved {r}'s lapsed deadline {old} to {new} on {p}"
                )
            continue
        inst = w.live_inst(p, r)
        assert inst is not None  # the table's live set is the ghost's (check_state)
        target = now + ext
        if cap is not None:
            target = min(target, inst.granted_at + cap)
        want = max(old, target)
        if new > want:
            capped = cap is not None and new > inst.granted_at + cap
            raise Violation(
                "I7" if capped else "I6",
                f"a heartbeat at {now} renewed {r} on {p} to {new}, past {want} (granted at "
                f"{inst.granted_at}, deadline {old})",
            )
        if new < want:
            raise Violation(
                "I8",
                f"a heartbeat at {now} renewed {r} on {p} to {new}, short of {want} (granted "
                f"at {inst.granted_at}, deadline {old})",
            )
    for r in lost:
        insts = w.inst.get((p, r))
        if insts and not insts[-1].live and insts[-1].reason == "transferred":
            raise Violation("I13", f"{p} reported {r} lost, but its lease was transferred")


def tombstone_owed(w: World_, p: str, r: str) -> tuple[str, bool] | None:
    """How ``r``'s last lease on ``p`` ended, and whether P must still remember
    it (within capacity and ttl; past the ttl it may be pruned at any reap)."""
    entry = w.tombs[p].get(r)
    if entry is None:
        return None
    reason, at = entry
    return reason, at + w.cfg.tombstone_ttl > w.now


def check_verdict(
    w: World_, p: str, r: str, *, live: bool, tomb: tuple[str, bool] | None, v: wire.Verdict
) -> None:
    ok = isinstance(v, wire.Ok)
    if ok != live:
        state = "live" if live else "ended or unknown"
        raise Violation(
            "I13", f"{p} answered {type(v).__name__} to {r}'s transfer-done, lease {state}"
        )
    if isinstance(v, wire.Nack) and tomb is not None:
        reason, must = tomb
        if v.reason != reason and (must or v.reason != "unknown"):
            raise Violation("I13", f"{p} answered NK:{v.reason} for {r}, whose lease was {reason}")


def check_use(w: World_, r: str) -> None:
    unread = [(d, p) for d in w.D for p in w.P if (r, d, p) not in w.reads]
    if unread:  # an OK from some P ranks vouches for nothing read from the others
        d, p = unread[0]
        raise Violation("I13", f"D used {r}'s KV, which {d} had not read from {p}")
    for (rr, d, p), held in w.reads.items():
        if rr == r and not held:
            raise Violation("I13", f"D used {r}'s KV read by {d} from {p} after its lease ended")


def check_schedule(w: World_) -> None:
    """I11 against what D really put on the wire (the ghost ``last_hb``), not
    the tracker's own record, which a bug could set without sending; on the
    clock the tracker runs on (:meth:`~.world.World.reader_now`)."""
    interval = w.cfg.heartbeat_interval
    for engine in w.tracker.engines():
        if engine in w.pending:
            continue
        last = w.last_hb.get(engine)
        if last is None or w.reader_now() - last >= interval:
            raise Violation(
                "I11", f"D stepped at {w.now} without a heartbeat to {engine} (last {last})"
            )
