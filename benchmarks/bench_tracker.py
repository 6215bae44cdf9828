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
from collections.abc import Sequence

from _common import interleaved, load, machine, ratio, table, us

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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--engines", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=15, help="interleaved batches per side")
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
        clock[0] += 1e-7
        up.due(1.0 + clock[0])

    def ours_all() -> None:
        clock[0] += CFG.heartbeat_interval
        if len(tr.due(now=clock[0])) != m:
            raise AssertionError("not every engine was due")

    def up_all() -> None:
        clock[0] += CFG.heartbeat_interval
        up.due(clock[0])

    idle = interleaved([ours_idle, up_idle], number=20_000, repeat=args.repeat)
    clock[0] = 10.0
    full = interleaved([ours_all, up_all], number=200, repeat=args.repeat)

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

    churn = interleaved([ours_churn, up_churn], number=20_000, repeat=args.repeat)
    print(
        f"decode-side heartbeat schedule: {n:,} tracked requests over {m} engines; "
        f"thread CPU time, best of {args.repeat} interleaved batches (wall time beside); "
        f"{machine()}; {load()}"
    )
    rows = []
    for label, ((oc, ow), (uc, uw)) in (
        ("due(): nothing due", idle),
        ("due(): every engine due", full),
        ("track + untrack one request", churn),
    ):
        rows.append([label, us(oc), us(uc), ratio(oc, uc), us(ow), us(uw), ratio(ow, uw)])
    print(
        table(
            [
                "step",
                "tracker CPU µs",
                "upstream-style CPU µs",
                "tracker / upstream (CPU)",
                "tracker wall µs",
                "upstream wall µs",
                "tracker / upstream (wall)",
            ],
            rows,
        )
    )
    (ic, _), (iuc, _) = idle
    (cc, _), (cuc, _) = churn
    print(
        f"targets: nothing due no slower than upstream's global timer: "
        f"{'met' if ic <= iuc else 'MISSED'} ({ratio(ic, iuc)}); track + untrack within 1.5x "
        f"of upstream's sets: {'met' if cc <= 1.5 * cuc else 'MISSED'} ({ratio(cc, cuc)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
