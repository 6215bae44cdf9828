"""The simulator's results, pinned: every figure, series and release of a few
small runs equal, to the last bit, what the simulator gave before it was made
faster (recorded with the event-per-step simulator of commit f563c89, in
``tests/data/sim_golden.json``).

A change that is meant to alter the simulation's results (a new rule, another
workload draw) records the file again, in its own commit that says why:
``python tests/test_sim_golden.py --write``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from leaseproto import LeaseConfig
from leaseproto.sim import Comparison, Crash, Hang, Policy, Surge, compare, preset

GOLDEN = Path(__file__).parent / "data" / "sim_golden.json"

_BUSY_D = {  # the fleet of the internet preset, short, with D engines that queue
    "duration": 300.0,
    "rate": 20.0,
    "d_slots": 2,
    "output_tokens": (400, 1200),
    "surges": (Surge(start=60.0, length=90.0, rate=15.0),),
    "crashes": (
        Crash(at=120.0, engine=0, down_for=60.0),
        Crash(at=140.0, engine=17, down_for=30.0),
        Crash(at=150.0, engine=101, down_for=200.0),
    ),
}

#: name -> (scenario, seed, policies or None for the default four)
CASES: dict[str, tuple[Any, int, list[Policy] | None]] = {
    "both": (preset("both", duration=300.0), 3, None),
    "surge": (
        preset("surge", duration=400.0, surges=(Surge(start=60.0, length=120.0, rate=3.0),)),
        5,
        None,
    ),
    "crash": (preset("crash", duration=240.0), 1, None),
    "hang": (
        preset("hang", duration=300.0, hangs=(Hang(at=30.0, engine=0, length=400.0),)),
        2,
        [Policy.lease(), Policy.lease(LeaseConfig(max_lease_lifetime=120.0), name="cap")],
    ),
    "small-notifications": (
        preset("surge", duration=200.0, surges=(Surge(start=60.0, length=120.0, rate=3.0),)),
        1,
        [Policy.lease(LeaseConfig(max_notification_bytes=128))],
    ),
    "scale": (preset("scale", duration=500.0), 4, None),
    "internet-busy": (preset("internet", **_BUSY_D), 0, None),
}


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def snapshot(comp: Comparison) -> dict[str, Any]:
    """Everything a comparison measured, as JSON-able values (floats exact)."""
    out: dict[str, Any] = {}
    for fig, series, run in zip(comp.figures, comp.series, comp.runs, strict=True):
        figs = fig.as_dict()
        figs.pop("wall_s")
        figs.pop("cpu_s")
        releases = [
            None
            if r is None
            else (r.reason.name, r.at.hex(), r.granted_at.hex(), r.deadline.hex(), r.last_renewal)
            for r in run.release_of
        ]
        out[fig.policy] = {
            "figures": figs,
            "death_to_release": fig.death_to_release,
            "series": _digest(asdict(series)),
            "releases": _digest(releases),
            "lost_at": _digest(run.lost_at),
        }
    return out


def _run(name: str) -> dict[str, Any]:
    sc, seed, pols = CASES[name]
    return snapshot(compare(sc, seed=seed, policies=pols))


@pytest.mark.parametrize("name", list(CASES))
def test_results_equal_the_recorded_ones(name: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(_run(name)))  # the same JSON round trip as the file's
    assert got == golden[name]


def test_policies_in_processes_give_the_same_figures() -> None:
    sc, seed, _ = CASES["both"]
    one = compare(sc, seed=seed)
    two = compare(sc, seed=seed, jobs=2)
    assert not two.runs and two.cpu_s > 0
    timing = ("wall_s", "cpu_s")
    assert [{k: v for k, v in f.as_dict().items() if k not in timing} for f in two.figures] == [
        {k: v for k, v in f.as_dict().items() if k not in timing} for f in one.figures
    ]
    assert two.series == one.series
    assert [f.death_to_release for f in two.figures] == [f.death_to_release for f in one.figures]


def test_the_recorded_runs_exercise_what_they_pin() -> None:
    golden = json.loads(GOLDEN.read_text())
    busy = golden["internet-busy"]
    # crashes strand requests, the lease renews, fixed 30 s expires leases D needed
    assert all(p["figures"]["stranded"] > 0 for p in busy.values())
    assert busy["lease"]["figures"]["renewals"] > 0
    assert busy["fixed 30s"]["figures"]["expired_while_needed"] > 0
    assert golden["hang"]["cap"]["figures"]["expired_while_needed"] > 0


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({n: _run(n) for n in CASES}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
