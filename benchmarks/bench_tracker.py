"""Decode side: the cost of ``HeartbeatTracker.due`` per D step.

10,000 tracked requests over 100 P engines (100 each). Two kinds of step:
nothing due (every engine had its heartbeat 1 s ago; the common case, every
forward pass) and everything due (every engine's interval has passed). Also
the cost of tracking and untracking one request.

Baseline, in the same process: upstream's scheduler bookkeeping: engine ->
set of ids plus ONE global last-heartbeat time; a due step copies every
engine's ids into lists (what crosses to the worker), a step with nothing due
is a single comparison. Upstream's global timer is cheaper when nothing is due
and is also why it loses an engine's turn (spec §11); the per-engine timers
are what this costs.

    python benchmarks/bench_tracker.py [--requests 10000] [--engines 100]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from collections.abc import Callable, Sequence

from _common import machine, ratio, table, us

from leaseproto import HeartbeatTracker, LeaseConfig

CFG = LeaseConfig()


class UpstreamSchedule:
    """Upstream's D-side bookkeeping: one global heartbeat timer."""

    def __init__(self, interval: float) -> None:
        self.by_engine: dict[str, set[str]] = {}
        self.last = 0.0
        self.interval = interval

    def track(self, rid: str, engine: str) -> None:
        self.by_engine.setdefault(engine, set()).add(rid)

    def untrack(self, rid: str, engine: str) -> None:
        ids = self.by_engine[engine]
        ids.discard(rid)
        if not ids:
            del self.by_engine[engine]

    def due(self, now: float) -> dict[str, list[str]]:
        if not self.by_engine or now - self.last < self.interval:
            return {}
        self.last = now
        return {e: list(ids) for e, ids in self.by_engine.items()}


def best(fn: Callable[[], object], number: int) -> float:
    """Seconds per call, best of 5 repeats."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--engines", type=int, default=100)
    args = ap.parse_args(argv)
    n, m = args.requests, args.engines
    tr = HeartbeatTracker(CFG)
    up = UpstreamSchedule(CFG.heartbeat_interval)
    for i in range(n):
        engine = f"prefill-{i % m}"
        tr.track(f"req-{i}", engine_id=engine, now=0.0)
        up.track(f"req-{i}", engine)
    clock = [0.0]
    tr.due(now=0.0)
    up.due(0.0)
    if len(tr.due(now=1.0)) != 0:
        sys.exit("tracker: something due 1 s after a heartbeat")

    def ours_idle() -> None:
        clock[0] += 1e-7  # stays within the interval
        tr.due(now=1.0 + clock[0])

    def up_idle() -> None:
        up.due(1.0 + clock[0])

    def ours_all() -> None:
        clock[0] += CFG.heartbeat_interval
        if len(tr.due(now=clock[0])) != m:
            raise AssertionError("not every engine was due")

    def up_all() -> None:
        clock[0] += CFG.heartbeat_interval
        up.due(clock[0])

    idle = (best(ours_idle, 20_000), best(up_idle, 20_000))
    clock[0] = 10.0
    full = (best(ours_all, 200), best(up_all, 200))

    k = [n]

    def ours_churn() -> None:
        rid = f"req-{k[0]}"
        tr.track(rid, engine_id="prefill-0", now=clock[0])
        tr.untrack(rid)
        k[0] += 1

    def up_churn() -> None:
        rid = f"req-{k[0]}"
        up.track(rid, "prefill-0")
        up.untrack(rid, "prefill-0")
        k[0] += 1

    churn = (best(ours_churn, 20_000), best(up_churn, 20_000))
    print(
        f"decode-side heartbeat schedule: {n:,} tracked requests over {m} engines; "
        f"best of 5; {machine()}"
    )
    rows = [
        ["due(): nothing due", us(idle[0]), us(idle[1]), ratio(idle[0], idle[1])],
        ["due(): every engine due", us(full[0]), us(full[1]), ratio(full[0], full[1])],
        ["track + untrack one request", us(churn[0]), us(churn[1]), ratio(churn[0], churn[1])],
    ]
    print(table(["step", "tracker µs", "upstream-style µs", "tracker / upstream"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
