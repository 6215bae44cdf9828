"""NIXL notification floor: round trip between two bare NIXL agents.

Two processes, each one ``nixl_agent`` with the UCX backend on CPU loopback
(the configuration ``NixlEndpoint`` uses), in a tight loop: this process
``send_notif``s a heartbeat-sized payload, the echo process spins on
``get_new_notifs`` and sends it back, this process spins until it arrives.
Measured for each agent configuration (``enable_prog_thread`` on and off), and
through ``NixlEndpoint`` (our adapter) on the same loop, so the adapter's and the
configuration's share of the round trip are apart. Thread CPU time is not the
point here (both sides spin): wall time per round trip.

With ``--load N``, N busy-loop processes (each dies with the benchmark: parent
death signal) keep the cores busy, and the round trip through ``NixlEndpoint``
is measured against ZeroMQ's (blocking receives), quiet then loaded, taking
turns ``--rounds`` times in the same run: the endpoint as the workers use it
(both sides in ``NixlEndpoint.wait``, a poll-and-sleep), the endpoint spun on
(both sides call ``poll`` in a tight loop), and ZeroMQ. Each cell is the
median of all trips, with the range of the rounds' medians; the ratio is of
the medians.

With ``--idle-cpu S``, a router, a prefill and a decode worker (``leaseproto
serve``, as ``Cluster`` starts them) idle for S seconds: the CPU seconds per
second each burns (from ``/proc``). Run it from two checkouts
(``PYTHONPATH=...``) to compare them.

    python benchmarks/bench_nixl_floor.py [--trips 300] [--load N [--rounds 3]] [--idle-cpu 10]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

from _common import load, machine, median, pct, table
from bench_e2e_nixl import nixl_round_trips, zmq_round_trips

PAYLOAD = b"HB:" + b",".join(f"chatcmpl-{i:032x}-{i:08x}".encode() for i in range(1))


def _agent(name: str, port: int, prog: bool) -> object:
    from leaseproto.adapters.nixl_runtime import load_nixl  # noqa: PLC0415 - child process

    nixl = load_nixl()
    cfg = nixl.nixl_agent_config(
        enable_prog_thread=prog, enable_listen_thread=True, listen_port=port, backends=["UCX"]
    )
    return nixl.nixl_agent(name, cfg)


def _connect(agent: object, peer: str, port: int) -> None:
    a: object = agent
    a.fetch_remote_metadata(peer, "127.0.0.1", port)  # type: ignore[attr-defined]
    a.send_local_metadata("127.0.0.1", port)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while not a.check_remote_metadata(peer):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise SystemExit(f"no metadata from {peer}")
        time.sleep(0.01)


def _echo(port: int, peer_port: int, prog: bool, count: int) -> None:
    agent = _agent("echo", port, prog)
    _connect(agent, "bench", peer_port)
    done = 0
    while done < count:
        for peer, msgs in agent.get_new_notifs().items():  # type: ignore[attr-defined]
            for m in msgs:
                agent.send_notif(peer, m)  # type: ignore[attr-defined]
                done += 1
    time.sleep(1.0)


def bare(prog: bool, trips: int) -> list[float]:
    from leaseproto.adapters.nixl_runtime import free_port  # noqa: PLC0415

    port, peer_port = free_port(), free_port()
    agent = _agent("bench", port, prog)
    child = mp.get_context("spawn").Process(target=_echo, args=(peer_port, port, prog, trips + 20))
    child.start()
    _connect(agent, "echo", peer_port)
    out = []
    for k in range(trips + 20):
        t0 = time.perf_counter()
        agent.send_notif("echo", PAYLOAD)  # type: ignore[attr-defined]
        while not agent.get_new_notifs():  # type: ignore[attr-defined]
            pass
        if k >= 20:  # warm-up trips left out
            out.append(time.perf_counter() - t0)
    child.join(30)
    return out


def idle_cpu(prog: bool, seconds: float = 2.0) -> float:
    """CPU seconds per second that one idle agent's process burns."""
    from leaseproto.adapters.nixl_runtime import free_port  # noqa: PLC0415

    agent = _agent(f"idle-{int(prog)}", free_port(), prog)
    t0, w0 = time.process_time(), time.monotonic()
    time.sleep(seconds)
    used = (time.process_time() - t0) / (time.monotonic() - w0)
    del agent
    return used


def _busy(parent: int) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the benchmark
    if os.getppid() != parent:  # the benchmark died before prctl
        return
    while True:
        pass


def start_load(n: int) -> list[BaseProcess]:
    """``n`` busy-loop processes; they die with this process."""
    procs: list[BaseProcess] = [
        mp.get_context("spawn").Process(target=_busy, args=(os.getpid(),), daemon=True)
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let them start spinning
    return procs


def _spread(rounds: list[list[float]]) -> str:
    meds = sorted(median(r) * 1e6 for r in rounds)
    every = [x for r in rounds for x in r]
    return f"{median(every) * 1e6:,.0f} ({meds[0]:,.0f}-{meds[-1]:,.0f})"


def under_load(n: int, trips: int, rounds: int) -> int:
    """NIXL (``NixlEndpoint``, waiting and spinning) against ZeroMQ, quiet and
    with ``n`` busy loops."""
    print(
        f"notification round trip under load, {trips} trips x {rounds} rounds, {len(PAYLOAD)} B; "
        f"{machine()}; {load()}"
    )
    head = [
        "busy loops",
        "NIXL, wait: median µs (rounds)",
        "p90 µs",
        "NIXL, spin: median µs (rounds)",
        "ZeroMQ: median µs (rounds)",
        "wait / ZeroMQ",
        "spin / ZeroMQ",
    ]
    rows = []
    for busy in (0, n):
        procs = start_load(busy)
        try:
            nw: list[list[float]] = []
            ns: list[list[float]] = []
            zq: list[list[float]] = []
            for _ in range(rounds):
                nw.append(nixl_round_trips([PAYLOAD], trips, prog=False, wait=True)["nixl 0"])
                ns.append(nixl_round_trips([PAYLOAD], trips, prog=False)["nixl 0"])
                zq.append(zmq_round_trips([PAYLOAD], trips)["zmq 0"])
        finally:
            for p in procs:
                p.kill()
                p.join(5)
        allw, alls, allz = ([x for r in rs for x in r] for rs in (nw, ns, zq))
        rows.append(
            [
                str(busy),
                _spread(nw),
                f"{pct(allw, 90) * 1e6:,.0f}",
                _spread(ns),
                _spread(zq),
                f"{median(allw) / median(allz):.1f}x",
                f"{median(alls) / median(allz):.1f}x",
            ]
        )
        print(table(head, rows[-1:]), f"; {load()}", flush=True)
    print(table(head, rows))
    return 0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_workers(seconds: float) -> int:
    """CPU seconds per second of an idle router, prefill and decode worker."""
    import leaseproto  # noqa: PLC0415
    from leaseproto.harness.cluster import Cluster, ClusterSpec  # noqa: PLC0415

    print(f"idle workers, {seconds:g} s; {leaseproto.__file__}; {machine()}; {load()}")
    with Cluster(ClusterSpec(trace=False)) as cluster:
        time.sleep(3.0)  # settle after start-up (connections, first heartbeats)
        workers = cluster.workers()
        before = [_cpu_s(w.proc.pid) for w in workers]
        t0 = time.monotonic()
        time.sleep(seconds)
        used = [_cpu_s(w.proc.pid) - b for w, b in zip(workers, before, strict=True)]
        span = time.monotonic() - t0
    rows = [[w.name, f"{u / span:.3f}"] for w, u in zip(workers, used, strict=True)]
    print(table(["worker", "CPU s per s"], rows), f"; {load()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trips", type=int, default=300)
    ap.add_argument("--load", type=int, default=0, help="busy-loop processes beside the run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-cpu", type=float, default=0, metavar="S", help="idle workers' CPU")
    args = ap.parse_args(argv)
    if args.idle_cpu > 0:
        return idle_workers(args.idle_cpu)
    if args.load > 0:
        return under_load(args.load, args.trips, args.rounds)
    print(
        f"NIXL notification round trip, {args.trips} trips, {len(PAYLOAD)} B; {machine()}; {load()}"
    )
    head = ["side", "progress thread", "median µs", "p99 µs", "min µs"]
    rows = []
    sides = [(side, prog) for side in ("bare agents", "NixlEndpoint") for prog in (True, False)]
    for side, prog in sides:
        if side == "bare agents":
            rtt = bare(prog, args.trips)
        else:
            rtt = nixl_round_trips([PAYLOAD], args.trips, prog=prog)["nixl 0"]
        rows.append(
            [
                side,
                "on" if prog else "off",
                f"{median(rtt) * 1e6:,.0f}",
                f"{pct(rtt, 99) * 1e6:,.0f}",
                f"{min(rtt) * 1e6:,.0f}",
            ]
        )
        print(table(head, rows[-1:]))
    print(table(head, rows))
    print(
        table(
            ["idle agent", "CPU s per s"],
            [["progress thread on", f"{idle_cpu(True):.3f}"], ["off", f"{idle_cpu(False):.3f}"]],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
