"""End to end over real NIXL on loopback (CPU, UCX): heartbeat round trip, and
the time from D's SIGKILL to P's release of its last block.

1. Round trip: a heartbeat notification (``wire.encode_heartbeat``, 1 and 70
   ids, about 57 B and 3.9 KB) goes from this process to an echo process and
   back, over NIXL ``send_notif``/``get_new_notifs`` (``NixlEndpoint``).
   Baseline, side by side with the same payloads and the same echo loop: a
   ZeroMQ DEALER/ROUTER pair on 127.0.0.1 (the transport of our control plane).
2. Reclaim: ``--runs`` times, a router, a prefill and a decode worker
   (``leaseproto serve``, each its own process, KV moved by NIXL READs) on a
   compressed timescale (``kv_lease_duration`` 3 s: heartbeat every 0.5 s,
   extension 2 s). More requests than D runs at once, so some wait in its
   queue; once D tracks them all and every lease has been renewed, D gets
   SIGKILL; P is polled until it holds no block. Compared with the bound
   ``lease_extension + heartbeat_interval`` (the spec's reclaim bound, plus
   the interval for the heartbeat D might have been about to send).

3. Verified reads: the same requests one at a time, once with D waiting for
   P's OK before it uses a read (the default) and once without
   (``--unverified-reads``): the added latency per request, and D's own
   measure of it (mean time from the READ's completion to the last OK).

    python benchmarks/bench_e2e_nixl.py [--runs 3] [--trips 300] [--verdict-requests 100]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from _common import machine, pct, ratio, table

from leaseproto import wire

ECHO = b"EC"
#: How long an endpoint keeps trying to connect: the echo process imports torch and NIXL
#: first, which takes tens of seconds on a loaded machine (the endpoint's default is 10 s)
CONNECT_S = 120.0


def _ids(n: int) -> list[str]:
    return [f"chatcmpl-{i:032x}-{i:08x}" for i in range(n)]


def _nixl_echo(port: int, peer_port: int, count: int, prog: bool, wait: bool) -> None:
    from leaseproto.adapters.nixl import NixlEndpoint  # noqa: PLC0415 - child process

    ep = NixlEndpoint("echo", port=port, progress_thread=prog, connect_timeout=CONNECT_S)
    ep.connect("bench", "127.0.0.1", peer_port)
    early: list[tuple[str, bytes]] = []  # the first trip may arrive before we see "connected"
    while not ep.is_connected("bench"):
        early += ep.poll()
        time.sleep(0.001)
    done = 0
    while done < count:
        if wait and not early:
            ep.wait(1.0)
        for peer, msg in early + ep.poll():
            ep.send(peer, msg)
            done += 1
        early = []
    time.sleep(0.5)
    ep.close()


def _zmq_echo(port: int, count: int) -> None:
    import zmq  # noqa: PLC0415

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    for _ in range(count):
        ident, msg = sock.recv_multipart()
        sock.send_multipart([ident, msg])
    sock.close(0)
    ctx.term()


def nixl_round_trips(
    payloads: Sequence[bytes], trips: int, *, prog: bool, wait: bool = False
) -> dict[str, list[float]]:
    """Seconds per round trip, per payload, between two ``NixlEndpoint``s, with
    NIXL's progress thread (``prog``) or with the endpoint's own progress; both
    sides spin on ``poll``, or with ``wait`` wait as the workers do
    (``NixlEndpoint.wait``: a poll-and-sleep)."""
    from leaseproto.adapters.nixl import NixlEndpoint, free_port  # noqa: PLC0415

    count = trips * len(payloads)
    spawn = mp.get_context("spawn")
    out: dict[str, list[float]] = {}
    port, peer_port = free_port(), free_port()
    ep = NixlEndpoint("bench", port=port, progress_thread=prog, connect_timeout=CONNECT_S)
    child = spawn.Process(target=_nixl_echo, args=(peer_port, port, count, prog, wait))
    child.start()
    ep.connect("echo", "127.0.0.1", peer_port)
    deadline = time.monotonic() + CONNECT_S
    while not ep.is_connected("echo"):
        if time.monotonic() > deadline:
            sys.exit("NIXL echo peer never connected")
        ep.poll()
        time.sleep(0.001)
    for k, payload in enumerate(payloads):
        rtt = out.setdefault(f"nixl {k}", [])
        for _ in range(trips):
            t0 = time.perf_counter()
            if not ep.send("echo", payload):
                sys.exit("NIXL send failed")
            while not ep.poll():
                if wait:
                    ep.wait(1.0)
            rtt.append(time.perf_counter() - t0)
    child.join(30)
    ep.close()
    return out


def round_trips(payloads: Sequence[bytes], trips: int) -> dict[str, list[float]]:
    """Seconds per round trip, per payload: NIXL with the endpoint's default (no
    progress thread), NIXL with NIXL's progress thread (the default before),
    then ZeroMQ."""
    out = nixl_round_trips(payloads, trips, prog=False)
    out.update(
        {
            k.replace("nixl", "thread"): v
            for k, v in nixl_round_trips(payloads, trips, prog=True).items()
        }
    )
    out.update(zmq_round_trips(payloads, trips))
    return out


def zmq_round_trips(payloads: Sequence[bytes], trips: int) -> dict[str, list[float]]:
    """Seconds per round trip, per payload, over a ZeroMQ DEALER/ROUTER pair on
    127.0.0.1 (blocking receives on both sides)."""
    import zmq  # noqa: PLC0415

    from leaseproto.adapters.nixl import free_port  # noqa: PLC0415

    out: dict[str, list[float]] = {}
    zport = free_port()
    zchild = mp.get_context("spawn").Process(target=_zmq_echo, args=(zport, trips * len(payloads)))
    zchild.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{zport}")
    for k, payload in enumerate(payloads):
        rtt = out.setdefault(f"zmq {k}", [])
        for _ in range(trips):
            t0 = time.perf_counter()
            sock.send(payload)
            sock.recv()
            rtt.append(time.perf_counter() - t0)
    zchild.join(30)
    sock.close(0)
    ctx.term()
    return out


def reclaim_run(n_requests: int) -> dict[str, Any]:
    """One cluster: queue requests on D, SIGKILL it, time P's last release."""
    from leaseproto.harness.cluster import Cluster, ClusterSpec  # noqa: PLC0415

    spec = ClusterSpec(kv_lease_duration=3.0, max_running=2, d_step_time=0.05)
    ext, interval = spec.config.lease_extension, spec.config.heartbeat_interval
    with Cluster(spec) as cluster:
        client = cluster.client()
        try:
            for i in range(n_requests):
                client.submit(f"k{i}", [(7 * i + j) % 50 for j in range(10)], 40)
            cluster.wait_decode_holds(client, n_requests, timeout=60.0)
            # every lease granted at least L - E ago has been renewed by now
            time.sleep(spec.kv_lease_duration - ext + 0.3)
            d = cluster.stats(cluster.decode[0])
            p = cluster.stats(cluster.prefill[0])
            held, live = p["blocks_held"], p["leases_live"]
            killed = cluster.kill(cluster.decode[0])
            released = cluster.last_release(until=killed + ext + interval + 10)
            p = cluster.stats(cluster.prefill[0])
        finally:
            client.close()
    return {
        "waiting": d["waiting"],
        "running": d["running"],
        "leases": live,
        "blocks": held,
        "reclaim": None if released is None else released - killed,
        "bound": ext + interval,
        "expired": p["table"]["released_expired"],
    }


def verdict_run(n_requests: int, *, verified: bool) -> dict[str, Any]:
    """One cluster: ``n_requests`` one after another (max_tokens 1, no modelled
    step time), each request's latency at the client; with ``verified`` D
    uses a read only after P's OK (the default), without it D uses reads
    unverified (``--unverified-reads``, stock behaviour)."""
    from leaseproto.harness.cluster import Cluster, ClusterSpec  # noqa: PLC0415

    extra = {} if verified else {"decode": ["--unverified-reads"]}
    spec = ClusterSpec(kv_lease_duration=3.0, max_running=1, d_step_time=0.0, extra=extra)
    latencies = []
    with Cluster(spec) as cluster:
        client = cluster.client()
        try:
            for i in range(n_requests + 5):  # the first 5 warm up (handshake, caches)
                client.submit(f"v{i}", [(11 * i + j) % 50 for j in range(10)], 1)
                got = client.wait_all(deadline=time.monotonic() + 30.0)
                r = got.get(f"v{i}")
                if r is None or not r["ok"] or r["recomputed"]:
                    raise RuntimeError(f"request v{i} did not complete from P's KV: {r}")
                if i >= 5:
                    latencies.append(r["_latency"])
            d = cluster.stats(cluster.decode[0])
        finally:
            client.close()
    waits = d["verdict_wait_us"] / max(1, d["verified_reads"]) / 1e6
    return {"latencies": latencies, "verified": d["verified_reads"], "wait": waits}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--trips", type=int, default=300)
    ap.add_argument("--verdict-requests", type=int, default=100)
    args = ap.parse_args(argv)
    print(f"end to end over NIXL (UCX, CPU memory, loopback); {machine()}")
    payloads = [wire.encode_heartbeat(_ids(n))[0] for n in (1, 70)]
    rtts = round_trips(payloads, args.trips)
    rows = []
    for k, payload in enumerate(payloads):
        nx, th, zq = rtts[f"nixl {k}"], rtts[f"thread {k}"], rtts[f"zmq {k}"]
        rows.append(
            [
                f"{len(payload):,} B",
                f"{statistics.median(nx) * 1e6:,.0f}",
                f"{pct(nx, 99) * 1e6:,.0f}",
                f"{statistics.median(th) * 1e6:,.0f}",
                f"{statistics.median(zq) * 1e6:,.0f}",
                f"{pct(zq, 99) * 1e6:,.0f}",
                ratio(statistics.median(nx), statistics.median(zq)),
            ]
        )
    print(f"heartbeat notification round trip, {args.trips} trips per payload:")
    print(
        table(
            [
                "payload",
                "NIXL median µs",
                "NIXL p99 µs",
                "with NIXL's progress thread, median µs",
                "ZeroMQ median µs",
                "ZeroMQ p99 µs",
                "NIXL / ZeroMQ",
            ],
            rows,
        )
    )
    runs = {v: verdict_run(args.verdict_requests, verified=v) for v in (True, False)}
    on, off = runs[True]["latencies"], runs[False]["latencies"]
    print(
        f"request latency, {args.verdict_requests} requests one at a time (max_tokens 1), "
        "verified reads on and off:"
    )
    print(
        table(
            ["reads", "median ms", "p90 ms", "min ms", "reads verified", "mean wait for OK ms"],
            [
                [
                    name,
                    f"{statistics.median(lat) * 1e3:.2f}",
                    f"{pct(lat, 90) * 1e3:.2f}",
                    f"{min(lat) * 1e3:.2f}",
                    str(r["verified"]),
                    f"{r['wait'] * 1e3:.2f}" if r["verified"] else "-",
                ]
                for name, lat, r in (
                    ("verified (OK from P)", on, runs[True]),
                    ("unverified (stock)", off, runs[False]),
                )
            ],
        )
    )
    print(
        "added latency per request (median): "
        f"{(statistics.median(on) - statistics.median(off)) * 1e3:+.2f} ms"
    )
    results = [reclaim_run(args.requests) for _ in range(args.runs)]
    rows = [
        [
            str(k + 1),
            str(r["waiting"]),
            str(r["running"]),
            str(r["leases"]),
            str(r["blocks"]),
            "-" if r["reclaim"] is None else f"{r['reclaim']:.2f}",
            f"{r['bound']:.2f}",
            "yes" if r["reclaim"] is not None and r["reclaim"] <= r["bound"] else "NO",
        ]
        for k, r in enumerate(results)
    ]
    print("D SIGKILL -> P frees its last block (kv_lease_duration 3 s):")
    print(
        table(
            [
                "run",
                "D waiting",
                "D running",
                "P leases",
                "P blocks",
                "reclaim s",
                "bound E+H s",
                "within",
            ],
            rows,
        )
    )
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
