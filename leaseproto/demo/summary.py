"""The texts ``leaseproto demo`` prints about its results: the header, each
phase's verdict and the summary tables (drawn by :mod:`.view`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import DemoSettings, PhaseResult
    from .turns import TurnsResult

__all__ = ["header", "table", "turns_table", "turns_verdict", "verdict"]


def header(settings: DemoSettings) -> str:
    return (
        f"leaseproto demo: kv_lease_duration {settings.kv_lease_duration:g} s, heartbeat "
        f"every {settings.heartbeat_interval:g} s, lease extension "
        f"{settings.lease_extension:g} s, device {settings.device}"
    )


def verdict(r: PhaseResult, settings: DemoSettings) -> str:
    if r.reclaim_bound_s is not None:
        if r.reclaim_s is None:
            return "no reclaim time measured (" + "; ".join(r.notes) + ")"
        within = "within" if r.reclaim_s <= r.reclaim_bound_s else "OVER"
        return (
            f"P freed every block {r.reclaim_s:.2f} s after the kill ({within} the bound "
            f"lease_extension + heartbeat_interval = {r.reclaim_bound_s:.2f} s); "
            f"{r.blocks_leaked} blocks leaked"
        )
    waited = r.longest_wait_s / settings.kv_lease_duration
    verified = (
        f"; {r.verified_reads} reads used after P's OK (mean wait {r.verdict_wait_ms:.1f} ms "
        f"after the READ), {r.recomputed} recomputed"
        if r.verdict_wait_ms is not None
        else f"; reads used unverified, {r.recomputed} recomputed"
    )
    return (
        f"{r.identical}/{r.requests} outputs identical to the reference, {r.differing} "
        f"different, {r.failed} failed; {r.leases_expired} leases expired, "
        f"{r.late_transfers} late transfer notifications; longest wait "
        f"{r.longest_wait_s:.1f} s ({waited:.1f} initial leases){verified}"
    )


def table(results: Sequence[PhaseResult]) -> tuple[list[str], list[list[str]], list[str]]:
    """The summary table: its head, rows and notes."""
    head = [
        "phase",
        "policy",
        "requests",
        "identical",
        "expired",
        "late\nxfers",
        "reclaim\ns",
        "bound\ns",
        "leaked",
    ]
    rows = [
        [
            r.name,
            r.policy,
            str(r.requests),
            "-" if r.name.startswith("2") else f"{r.identical}/{r.requests}",
            str(r.leases_expired),
            str(r.late_transfers),
            "-" if r.reclaim_s is None else f"{r.reclaim_s:.2f}",
            "-" if r.reclaim_bound_s is None else f"{r.reclaim_bound_s:.2f}",
            str(r.blocks_leaked),
        ]
        for r in results
    ]
    notes = [f"  {r.name}: {note}" for r in results for note in r.notes]
    return head, rows, notes


def turns_verdict(r: TurnsResult) -> str:
    reasons = ", ".join(
        f"{why}" if n == 1 else f"{n} {why}" for why, n in sorted(r.recomputed.items())
    )
    reached = (
        f"turn 2 reached P's READ {min(r.reached_s):.1f}-{max(r.reached_s):.1f} s after D "
        f"cached turn 1 (lease {r.ttl_s:g} s)"
        if r.reached_s
        else "no turn 2 reached P's READ"
    )
    stall = "expired meanwhile" if r.expired_stalled else "held"
    return (
        f"{r.identical}/{r.conversations} turn-2 outputs identical to the reference "
        f"({r.differing} different, {r.failed} failed); {reached}; P sent D "
        f"{r.heartbeats} heartbeats: {r.kept} cached turns kept past their lease, "
        f"{r.expired_waiting} expired while turn 2 waited; prefixes: {r.verified} used "
        f"after D's OK, {r.unverified} used as read, {sum(r.recomputed.values())} "
        f"recomputed{f' ({reasons})' if reasons else ''}. The read P stalled on "
        f"{r.stall_s:g} s after the gate (D's lease {stall}, {r.nk} NK from D): "
        f"{r.stalled}"
    )


def turns_table(results: Sequence[TurnsResult]) -> tuple[list[str], list[list[str]], list[str]]:
    """The multi-turn table: its head, rows and notes."""
    head = [
        "phase",
        "turn-2\nreads",
        "turn 2\nidentical",
        "prefix\nverified",
        "used\nas read",
        "recom-\nputed",
        "turns\nkept",
        "expired\nwaiting",
        "I14\nviol.",
    ]
    rows = [
        [
            r.name,
            r.reads,
            f"{r.identical}/{r.conversations}",
            str(r.verified),
            str(r.unverified),
            str(sum(r.recomputed.values())),
            str(r.kept),
            str(r.expired_waiting),
            str(r.violations_i14),
        ]
        for r in results
    ]
    notes = [f"  {r.name}: {note}" for r in results for note in r.notes]
    return head, rows, notes
