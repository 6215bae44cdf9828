"""Heartbeat handling on P: request ids decoded and renewed per second.

P holds 10,000 live leases; D's heartbeat names all of them, split by
``max_bytes`` into one large message or many small ones (encoded beforehand:
this measures only P). P runs ``LeaseTable.renew_heartbeat`` on each message (decode and
renew fused: ids naming a lease were validated at grant, the rest as ``decode``
validates them); ``wire.decode`` and ``LeaseTable.renew`` apart are timed beside
it, on a second table. The sides take turns round by round (each round: every
message once), the order alternating. Baseline, in the same process on the same messages: upstream's
handler (strip ``HB:``, split on ``,``, ``max(old, now + extension)`` on a
dict; no validation, no counters).

With a cluster key (spec §10.3) each message travels sealed: the second table
puts P's handling of a sealed heartbeat (``PeerAuth.open``: unpack, HMAC-SHA256
check, replay window; then the same fused renew) beside the unsealed one,
round by round in turns, the same ids split to leave room for the frame, and
D's cost to seal one message. The ratio is per round (median, and the range
over rounds); the added cost is per message, from the best rounds.

    python benchmarks/bench_heartbeat.py [--leases 10000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from time import perf_counter_ns, thread_time_ns

from _common import load, machine, median, table

from leaseproto import LeaseConfig, LeaseTable, wire
from leaseproto.core.mac import FRAME_OVERHEAD, ClusterKey
from leaseproto.core.mac_peers import ANSWER, GREETING, PeerAuth

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


def _batch(fn: Callable[[bytes], object], msgs: list[bytes]) -> tuple[int, int]:
    """Thread CPU ns and wall ns for ``fn`` on every message, in order."""
    w0, c0 = perf_counter_ns(), thread_time_ns()
    for msg in msgs:
        fn(msg)
    return thread_time_ns() - c0, perf_counter_ns() - w0


def measure(ids: list[str], max_bytes: int, rounds: int) -> dict[str, float]:
    msgs = wire.encode_heartbeat(ids, max_bytes=max_bytes)
    decoded = [m.ids for m in map(wire.decode, msgs) if isinstance(m, wire.Heartbeat)]
    table_ = LeaseTable(CFG)
    parts = LeaseTable(CFG)
    for t in (table_, parts):  # one table after the other: each lies in memory as P's would
        for rid in ids:
            t.grant(rid, now=0.0)
    up = UpstreamHandler(ids, CFG.lease_extension)
    best = dict.fromkeys(("ours", "up", "ours_wall", "up_wall", "decode", "renew"), float("inf"))
    for r in range(rounds):
        now = 1.0 + r * 0.001

        def ours(msg: bytes, now: float = now) -> None:  # P's worker: decode + renew fused
            if table_.renew_heartbeat(msg, now=now) is None:
                sys.exit("the fused path refused a heartbeat")

        def upstream(msg: bytes, now: float = now) -> None:
            up.handle(msg, now)

        sides: list[tuple[str, Callable[[bytes], object]]] = [("ours", ours), ("up", upstream)]
        for name, fn in sides if r % 2 == 0 else sides[::-1]:  # interleaved, order alternating
            cpu, wall = _batch(fn, msgs)
            best[name] = min(best[name], cpu)
            best[name + "_wall"] = min(best[name + "_wall"], wall)
        # the two steps apart, as before the fused path (on a second table)
        best["decode"] = min(best["decode"], _batch(wire.decode, msgs)[0])
        c0 = thread_time_ns()
        for batch in decoded:
            parts.renew(batch, now=now)
        best["renew"] = min(best["renew"], thread_time_ns() - c0)
    if table_.stats.renewed != rounds * len(ids) or parts.stats.renewed != rounds * len(ids):
        sys.exit("not every id was renewed")
    per = len(ids)
    out = {k: per / (v * 1e-9) for k, v in best.items()}
    return {"msgs": len(msgs), "bytes": sum(map(len, msgs)), **out}


def _connected() -> tuple[PeerAuth, PeerAuth]:
    """D's and P's ends of one sealed connection."""
    key = ClusterKey.from_bytes(b"bench_heartbeat cluster key, 32 bytes")
    d, p = PeerAuth(key, "decode-r0-bench"), PeerAuth(key, "prefill-engine-r0-bench")
    d.expect(p.agent)
    for src, dst, msg in ((d, p, GREETING), (p, d, ANSWER)):
        frame = src.seal(dst.agent, msg)
        if frame is None or dst.open(src.agent, frame) != msg:
            sys.exit("the bench connection did not open")
    return d, p


def measure_mac(ids: list[str], max_bytes: int | None, rounds: int) -> dict[str, float]:
    """P's handling of sealed against unsealed heartbeats (the same ids, each
    message leaving room for the frame; ``max_bytes`` None: one id per
    message), and D's cost to seal."""
    if max_bytes is None:
        msgs = [wire.HEARTBEAT_PREFIX + rid.encode() for rid in ids]
    else:
        msgs = wire.encode_heartbeat(ids, max_bytes=max_bytes - FRAME_OVERHEAD)
    d, p = _connected()
    keyed, plain = LeaseTable(CFG), LeaseTable(CFG)
    for t in (keyed, plain):
        for rid in ids:
            t.grant(rid, now=0.0)
    ratios: list[float] = []
    best = dict.fromkeys(("keyed", "plain", "seal"), float("inf"))
    for r in range(rounds):
        now = 1.0 + r * 0.001
        frames: list[bytes] = []

        def seal_all(msgs_: list[bytes] = msgs, out: list[bytes] = frames) -> None:
            for msg in msgs_:
                out.append(d.seal(p.agent, msg) or b"")

        c0 = thread_time_ns()
        seal_all()
        best["seal"] = min(best["seal"], thread_time_ns() - c0)

        def sealed(frame: bytes, now: float = now) -> None:
            payload = p.open(d.agent, frame)
            if not isinstance(payload, bytes) or keyed.renew_heartbeat(payload, now=now) is None:
                sys.exit("a sealed heartbeat was refused")

        def unsealed(msg: bytes, now: float = now) -> None:
            if plain.renew_heartbeat(msg, now=now) is None:
                sys.exit("the fused path refused a heartbeat")

        took = {}
        sides = [("keyed", sealed, frames), ("plain", unsealed, msgs)]
        for name, fn, batch in sides if r % 2 == 0 else sides[::-1]:
            took[name] = _batch(fn, batch)[0]
            best[name] = min(best[name], took[name])
        ratios.append(took["keyed"] / took["plain"])
    if keyed.stats.renewed != rounds * len(ids) or any(p.dropped.values()):
        sys.exit("not every sealed id was renewed")
    n = len(msgs)
    return {
        "msgs": n,
        "bytes": (sum(map(len, msgs)) + n * FRAME_OVERHEAD) / n,
        "plain_ns": best["plain"] / n,
        "keyed_ns": best["keyed"] / n,
        "open_ns": (best["keyed"] - best["plain"]) / n,
        "seal_ns": best["seal"] / n,
        "median": median(ratios),
        "lo": min(ratios),
        "hi": max(ratios),
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
                f"{m['up'] / 1e6:.2f}",
                f"{m['ours'] / m['up']:.2f}x",
                f"{m['ours_wall'] / 1e6:.2f}",
                f"{m['up_wall'] / 1e6:.2f}",
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
                "decode+renew fused M ids/s",
                "upstream M ids/s",
                "ours / upstream (CPU)",
                "ours wall M ids/s",
                "upstream wall M ids/s",
            ],
            rows,
        )
    )
    print(
        f"\nwith a cluster key: each message sealed ({FRAME_OVERHEAD} bytes of frame: MAC "
        "HMAC-SHA256/128, nonces, sequence); P's handling per message, sealed and unsealed "
        "taking turns round by round; thread CPU time"
    )
    mac_rows = []
    for label, mac_mb in (("one id each", None), ("default 4 KiB", 4096), ("small 512 B", 512)):
        m = measure_mac(ids, mac_mb, args.rounds)
        mac_rows.append(
            [
                label,
                f"{m['msgs']:,}",
                f"{m['bytes']:,.0f}",
                f"{m['plain_ns'] / 1e3:.2f}",
                f"{m['keyed_ns'] / 1e3:.2f}",
                f"{m['open_ns'] / 1e3:.2f}",
                f"{m['seal_ns'] / 1e3:.2f}",
                f"{m['median']:.2f}x ({m['lo']:.2f}-{m['hi']:.2f})",
            ]
        )
    print(
        table(
            [
                "messages",
                "count",
                "bytes each (sealed)",
                "P unsealed us/msg",
                "P sealed us/msg",
                "MAC check added us/msg",
                "D seal us/msg",
                "sealed / unsealed (median, range)",
            ],
            mac_rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
