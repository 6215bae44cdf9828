"""Heartbeat notification payload: bytes per renewed request, and how many
messages ``max_bytes`` splitting produces.

Ids have the shape of vLLM's P-side ids (``chatcmpl-<uuid>-<8 hex>``, 50-54
bytes). For each number of ids one D heartbeat carries to one P engine, and
each ``max_bytes``, ``wire.encode_heartbeat`` gives the message count, the
bytes on the wire and the encode time per id, of ``encode_heartbeat`` (every id
checked) and of D's path, ``HeartbeatTracker.payloads`` (ids checked once, at
``track``; the same bytes). Baseline, in the same process:
upstream's single unsplit ``b"HB:" + b",".join(ids)`` (no validation, no
splitting; B5: a transport may drop it when it is large).

    python benchmarks/bench_payload.py
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Sequence

from _common import interleaved, load, machine, table

from leaseproto import HeartbeatTracker, LeaseConfig, wire

CFG = LeaseConfig()
#: D's encoder (``HeartbeatTracker.payloads``): the ids were checked at ``track``
TRACKER = HeartbeatTracker(CFG)


def upstream_encode(ids: Sequence[str]) -> bytes:
    return b"HB:" + ",".join(ids).encode()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,10,100,1000,10000")
    ap.add_argument("--max-bytes", default="512,4096,65536")
    args = ap.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    limits = [int(b) for b in args.max_bytes.split(",")]
    rng_ids = [
        f"chatcmpl-{uuid.UUID(int=i * 7919 + 1, version=4)}-{i:08x}" for i in range(max(counts))
    ]
    print(
        f"heartbeat payload per D->P heartbeat, ids of {len(rng_ids[0])} bytes; encode time "
        f"in thread CPU time, interleaved with upstream's, best of 7; {machine()}; {load()}"
    )
    rows = []
    for n in counts:
        ids = rng_ids[:n]
        up = upstream_encode(ids)
        for mb in limits:
            msgs = wire.encode_heartbeat(ids, max_bytes=mb)
            if sorted(i for m in msgs for i in wire.decode(m).ids) != sorted(ids):  # type: ignore[union-attr]
                sys.exit("round trip lost an id")
            size = sum(map(len, msgs))
            if TRACKER.payloads(ids, max_bytes=mb) != msgs:
                sys.exit("the tracker's encoder differs from encode_heartbeat")

            # defs, not lambdas: mypy cannot type a lambda's defaulted arguments against
            # interleaved's Callable[[], object]; this iteration's ids and mb bound as defaults
            def ours(ids: list[str] = ids, mb: int = mb) -> list[bytes]:
                return wire.encode_heartbeat(ids, max_bytes=mb)

            def tracker(ids: list[str] = ids, mb: int = mb) -> list[bytes]:
                return TRACKER.payloads(ids, max_bytes=mb)

            def upstream(ids: list[str] = ids) -> bytes:
                return upstream_encode(ids)

            (t, _), (t_tr, _), (t_up, _) = interleaved(
                [ours, tracker, upstream], number=20, repeat=7
            )
            rows.append(
                [
                    f"{n:,}",
                    f"{mb:,}",
                    f"{len(msgs):,}",
                    f"{max(map(len, msgs)):,}",
                    f"{size:,}",
                    f"{size / n:.1f}",
                    f"{len(up):,}",
                    f"{(size / len(up) - 1) * 100:+.2f}%",
                    f"{t / n * 1e9:,.0f}",
                    f"{t_tr / n * 1e9:,.0f}",
                    f"{t_up / n * 1e9:,.0f}",
                    f"{t_tr / t_up:.1f}x",
                ]
            )
    print(
        table(
            [
                "ids",
                "max_bytes",
                "messages",
                "largest B",
                "total B",
                "B per id",
                "upstream B (1 msg)",
                "ours vs upstream B",
                "encode_heartbeat ns/id",
                "tracker.payloads ns/id",
                "upstream ns/id",
                "tracker / upstream",
            ],
            rows,
        )
    )
    per_beat = sum(
        map(len, wire.encode_heartbeat(rng_ids[:1000], max_bytes=CFG.max_notification_bytes))
    )
    print(
        f"at the defaults (every {CFG.heartbeat_interval:g} s, max_bytes "
        f"{CFG.max_notification_bytes}), 1,000 requests waiting on one P engine cost "
        f"{per_beat / CFG.heartbeat_interval:,.0f} B/s of heartbeat payload "
        f"({1000 / CFG.heartbeat_interval:.0f} renewals/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
