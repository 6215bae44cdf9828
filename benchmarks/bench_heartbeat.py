"""Heartbeat handling on P: request ids decoded and renewed per second.

P holds 10,000 live leases; D's heartbeat names all of them, split by
``max_bytes`` into one large message or many small ones (encoded beforehand:
this measures only P). P runs ``wire.decode`` then ``LeaseTable.renew`` on each
message. Baseline, in the same process on the same messages: upstream's
handler (strip ``HB:``, split on ``,``, ``max(old, now + extension)`` on a
dict; no validation, no counters).

    python benchmarks/bench_heartbeat.py [--leases 10000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from time import perf_counter_ns, thread_time_ns

from _common import load, machine, table

from leaseproto import LeaseConfig, LeaseTable, wire

CFG = LeaseConfig()


class UpstreamHandler:
    """The shape of upstream's ``_handle_heartbeat`` on its lease dict."""

    def __init__(self, ids: Sequence[str], extension: float) -> None:
        self.deadline = dict.fromkeys(ids, CFG.kv_lease_duration)
        self.extension = extension

    def handle(self, msg: bytes, now: float) -> int:
        new = now + self.extension
        dl = self.deadline
        n = 0
        for rid in msg[3:].decode().split(","):
            old = dl.get(rid)
            if old is not None:
                dl[rid] = max(old, new)
                n += 1
        return n


def ours_handle(table: LeaseTable, msg: bytes, now: float) -> tuple[int, int]:
    """Decode and renew; returns (ns spent decoding, ns renewing)."""
    t0 = thread_time_ns()
    decoded = wire.decode(msg)
    t1 = thread_time_ns()
    assert isinstance(decoded, wire.Heartbeat)
    table.renew(decoded.ids, now=now)
    return t1 - t0, thread_time_ns() - t1


def measure(ids: list[str], max_bytes: int, rounds: int) -> dict[str, float]:
    msgs = wire.encode_heartbeat(ids, max_bytes=max_bytes)
    table_ = LeaseTable(CFG)
    for rid in ids:
        table_.grant(rid, now=0.0)
    up = UpstreamHandler(ids, CFG.lease_extension)
    dec_r: list[float] = []
    ren_r: list[float] = []
    ours_r: list[float] = []
    up_r: list[float] = []
    wall_r: list[float] = []
    upw_r: list[float] = []
    for r in range(rounds):
        now = 1.0 + r * 0.001
        d = n = u = 0
        w = uw = 0
        for msg in msgs:  # alternate sides message by message
            w0 = perf_counter_ns()
            a, b = ours_handle(table_, msg, now)
            w += perf_counter_ns() - w0
            d += a
            n += b
            w0, t0 = perf_counter_ns(), thread_time_ns()
            up.handle(msg, now)
            u += thread_time_ns() - t0
            uw += perf_counter_ns() - w0
        wall_r.append(w)
        upw_r.append(uw)
        dec_r.append(d)
        ren_r.append(n)
        ours_r.append(d + n)
        up_r.append(u)
    if table_.stats.renewed != rounds * len(ids):
        sys.exit("not every id was renewed")
    per = len(ids)
    return {
        "msgs": len(msgs),
        "bytes": sum(map(len, msgs)),
        "ours": per / (min(ours_r) * 1e-9),
        "decode": per / (min(dec_r) * 1e-9),
        "renew": per / (min(ren_r) * 1e-9),
        "upstream": per / (min(up_r) * 1e-9),
        "ours_wall": per / (min(wall_r) * 1e-9),
        "upstream_wall": per / (min(upw_r) * 1e-9),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    ids = [f"chatcmpl-{rng.getrandbits(128):032x}-{i:08x}" for i in range(args.leases)]
    print(
        f"heartbeat handling on P: {args.leases:,} ids ({len(ids[0])} bytes each) per round, "
        f"best of {args.rounds} rounds, thread CPU time (wall beside); {machine()}; {load()}"
    )
    rows = []
    for label, mb in (("one large", 1 << 20), ("default 4 KiB", 4096), ("small 512 B", 512)):
        m = measure(ids, mb, args.rounds)
        rows.append(
            [
                label,
                f"{m['msgs']:,}",
                f"{m['bytes'] / m['msgs']:,.0f}",
                f"{m['decode'] / 1e6:.2f}",
                f"{m['renew'] / 1e6:.2f}",
                f"{m['ours'] / 1e6:.2f}",
                f"{m['upstream'] / 1e6:.2f}",
                f"{m['ours'] / m['upstream']:.2f}x",
                f"{m['ours_wall'] / 1e6:.2f}",
                f"{m['upstream_wall'] / 1e6:.2f}",
            ]
        )
    print(
        table(
            [
                "messages",
                "count",
                "bytes each",
                "decode only M ids/s",
                "renew only M ids/s",
                "decode+renew M ids/s",
                "upstream M ids/s",
                "ours / upstream (CPU)",
                "ours wall M ids/s",
                "upstream wall M ids/s",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
