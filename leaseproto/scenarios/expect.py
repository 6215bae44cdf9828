"""``expect`` lines of a replay scenario: compare what the reference
implementation did so far with what the scenario's author worked out (spec §12)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .format import Op, ScenarioError
from .replay_state import TOL, Rank, World

__all__ = ["check"]


def _ranks(rp: World, where: str | None, line: int) -> list[Rank]:
    if where is None:
        return [r for rs in rp.ranks.values() for r in rs]
    if where in rp.ranks:
        return rp.ranks[where]
    for rs in rp.ranks.values():
        for r in rs:
            if r.name == where:
                return [r]
    raise ScenarioError(line, f"expect: 'where' names no engine or rank: {where!r}")


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def check(rp: World, op: Op) -> list[str]:
    """What does not hold, one sentence each (empty: all holds).

    Raises:
        ScenarioError: the line names an unknown rank or counter.
    """
    a = op.args
    ranks = _ranks(rp, a.get("where"), op.line)
    bad: list[str] = []
    for r in ranks:
        tab = r.table
        if "live" in a and sorted(tab.live()) != sorted(a["live"]):
            bad.append(f"live on {r.name} is {sorted(tab.live())}, expected {sorted(a['live'])}")
        for rid, want in a.get("released", {}).items():
            reason = want["reason"] if isinstance(want, dict) else want
            got = r.releases.get(rid)
            if got is None:
                bad.append(f"{rid} not released on {r.name}, expected {reason}")
            elif got[0] != reason:
                bad.append(f"{rid} released on {r.name} as {got[0]}, expected {reason}")
            elif isinstance(want, dict) and "at" in want and not _close(got[1], want["at"]):
                bad.append(f"{rid} released on {r.name} at {got[1]:.6g}, expected {want['at']:.6g}")
        for rid, want in a.get("deadline", {}).items():
            got_d = tab.deadline(rid)
            if not _close(got_d, want):
                bad.append(f"deadline of {rid} on {r.name} is {got_d}, expected {want}")
        if "nacked" in a and sorted(r.nacks) != sorted(a["nacked"]):
            bad.append(f"nacks from {r.name} are {sorted(r.nacks)}, expected {sorted(a['nacked'])}")
    if "p_stats" in a:
        totals: dict[str, Any] = {}
        for r in ranks:
            for k, v in {**asdict(r.table.stats), "malformed": r.malformed}.items():
                totals[k] = totals.get(k, 0) + v
        bad.extend(_stats(rp.written("p_stats"), totals, a["p_stats"], op.line))
    if "tracked" in a and rp.tracked() != sorted(a["tracked"]):
        bad.append(f"{rp.R} tracks {rp.tracked()}, expected {sorted(a['tracked'])}")
    if "d_stats" in a:
        have = {} if rp.tracker is None else asdict(rp.tracker.stats)
        if rp.tracker is None:
            bad.append(f"{rp.written('d_stats')}: {rp.R} is down")
        else:
            bad.extend(_stats(rp.written("d_stats"), have, a["d_stats"], op.line))
    for rid, want in a.get("uses", {}).items():
        found = rp.uses.get(rid, [])
        if found != want:
            bad.append(f"uses of {rid} found {found}, expected {want}")
    return bad


def _stats(name: str, have: dict[str, Any], want: dict[str, int], line: int) -> list[str]:
    unknown = sorted(set(want) - set(have))
    if unknown:
        raise ScenarioError(
            line, f"expect: unknown {name} counter(s) {unknown}; known: {sorted(have)}"
        )
    return [f"{name}.{k} is {have[k]}, expected {v}" for k, v in want.items() if have[k] != v]
