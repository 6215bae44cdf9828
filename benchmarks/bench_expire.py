"""Prefill side: ``expire`` when many leases come due at once, and bytes per lease.

1. Burst: ``--due`` leases (10,000) granted in one step come due in the same
   ``expire`` call, among ``--live`` (100,000) live leases in all. Reported: thread CPU
   time per released lease (target: at most 1 µs), wall time beside it; baseline in
   the same process, interleaved run by run: upstream's full scan of a dict of
   deadlines (``[rid for rid, d in dl.items() if d <= now]`` then ``del``).
2. Memory: ``tracemalloc`` bytes retained per live lease after granting N leases
   (100 per 10 ms step, or n/1000) and after one heartbeat has renewed them all, against
   upstream's dict of floats on the same schedule (the ids themselves are allocated
   before and not counted); and bytes per tombstone (an ended lease P remembers).

    python benchmarks/bench_expire.py [--live 100000] [--due 10000] [--sizes 100000,1000000]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence

from _common import load, machine, ratio, table

from leaseproto import LeaseConfig, LeaseTable

CFG = LeaseConfig()
STEP = 0.01
PER_STEP = 100


def _ids(n: int, tag: str = "") -> list[str]:
    return [f"chatcmpl-{tag}{i:032x}-{i:08x}" for i in range(n)]


def burst(live: int, due: int, repeat: int) -> dict[str, float]:
    ids = _ids(live)
    best = {"ours": float("inf"), "ours_wall": float("inf"), "up": float("inf")}
    best["up_wall"] = float("inf")
    for r in range(repeat):
        sides = ["ours", "up"] if r % 2 == 0 else ["up", "ours"]
        for side in sides:
            gc.collect()
            if side == "ours":
                t = LeaseTable(CFG)
                for rid in ids[:due]:
                    t.grant(rid, now=0.0)
                for k, rid in enumerate(ids[due:]):
                    t.grant(rid, now=1.0 + k // PER_STEP * STEP)
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                out = t.expire(now=CFG.kv_lease_duration)
                c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                got = len(out)
            else:
                dl: dict[str, float] = {}
                for rid in ids[:due]:
                    dl[rid] = 0.0 + CFG.kv_lease_duration
                for k, rid in enumerate(ids[due:]):
                    dl[rid] = 1.0 + k // PER_STEP * STEP + CFG.kv_lease_duration
                now = CFG.kv_lease_duration
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                done = [rid for rid, d in dl.items() if d <= now]
                for rid in done:
                    del dl[rid]
                c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                got = len(done)
            if got != due:
                sys.exit(f"{side}: released {got}, expected {due}")
            best[side] = min(best[side], (c1 - c0) * 1e-9 / due)
            best[side + "_wall"] = min(best[side + "_wall"], (w1 - w0) * 1e-9 / due)
    return best


def _retained(build: Callable[[], object]) -> int:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    keep = build()
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del keep
    return size


def memory(n: int) -> dict[str, float]:
    ids = _ids(n)
    per_step = max(PER_STEP, n // 1000)  # grants span 10 s, so all are live at renew_now
    renew_now = CFG.kv_lease_duration / 2

    def ours(renew: bool) -> object:
        t = LeaseTable(CFG)
        for k, rid in enumerate(ids):
            t.grant(rid, now=k // per_step * STEP)
        if renew:
            t.renew(ids, now=renew_now)
        return t

    def upstream(renew: bool) -> object:
        dl: dict[str, float] = {}
        for k, rid in enumerate(ids):
            dl[rid] = k // per_step * STEP + CFG.kv_lease_duration
        if renew:
            new = renew_now + CFG.lease_extension
            for rid in ids:
                dl[rid] = max(dl[rid], new)
        return dl

    def ended(capacity: int) -> object:
        t = LeaseTable(LeaseConfig(tombstone_capacity=capacity))
        for k, rid in enumerate(ids):
            t.grant(rid, now=k // per_step * STEP)
        t.expire(now=CFG.kv_lease_duration + n // per_step * STEP)
        return t

    out = {
        "ours": _retained(lambda: ours(False)) / n,
        "ours_renewed": _retained(lambda: ours(True)) / n,
        "up": _retained(lambda: upstream(False)) / n,
        "up_renewed": _retained(lambda: upstream(True)) / n,
    }
    # the same history with and without tombstones kept
    out["tomb"] = (_retained(lambda: ended(n)) - _retained(lambda: ended(1))) / (n - 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", type=int, default=100_000)
    ap.add_argument("--due", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sizes", default="100000,1000000")
    args = ap.parse_args(argv)
    print(f"{machine()}; {load()}")
    b = burst(args.live, args.due, args.repeat)
    print(
        f"expire: {args.due:,} leases due in one call among {args.live:,} live; "
        f"best of {args.repeat} interleaved runs"
    )
    print(
        table(
            [
                "released",
                "table CPU µs/lease",
                "full scan CPU µs/lease",
                "table wall µs/lease",
                "full scan wall µs/lease",
                "table / full scan (CPU)",
            ],
            [
                [
                    f"{args.due:,}",
                    f"{b['ours'] * 1e6:.2f}",
                    f"{b['up'] * 1e6:.2f}",
                    f"{b['ours_wall'] * 1e6:.2f}",
                    f"{b['up_wall'] * 1e6:.2f}",
                    ratio(b["ours"], b["up"]),
                ]
            ],
        )
    )
    print(
        f"target: at most 1 µs per released lease: "
        f"{'met' if b['ours'] <= 1e-6 else 'MISSED'} ({b['ours'] * 1e6:.2f} µs CPU)"
    )
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        m = memory(n)
        rows.append(
            [
                f"{n:,}",
                f"{m['ours']:.0f}",
                f"{m['up']:.0f}",
                ratio(m["ours"], m["up"]),
                f"{m['ours_renewed']:.0f}",
                f"{m['up_renewed']:.0f}",
                ratio(m["ours_renewed"], m["up_renewed"]),
                f"{m['tomb']:.0f}",
            ]
        )
    print("memory (tracemalloc), bytes per lease, ids not counted:")
    print(
        table(
            [
                "leases",
                "table B/lease (granted)",
                "dict of floats B/lease",
                "ratio",
                "table B/lease (renewed)",
                "dict of floats B/lease (renewed)",
                "ratio (renewed)",
                "B per tombstone",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
