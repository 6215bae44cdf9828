"""The core's hot paths against vLLM 0.32's own code and a hand-written floor (issue 19).

Each row runs three sides in one process, taking turns repeat by repeat (the order
rotating), on the same input, and times each with thread CPU time:

* **ours**: leaseproto's core, validation and counters included;
* **vLLM**: vLLM 0.32's own methods, imported from the installed vLLM and called on a
  small stand-in ``self`` holding the attributes they read (``_handle_heartbeat``,
  ``_reap_expired_send_leases``, ``on_new_request``, ``_stop_heartbeat``); where the
  code is a few lines inside a larger method (the heartbeat throttle of
  ``build_connector_meta``, the payload of ``_send_heartbeats``), those lines,
  transcribed with their place named;
* **floor**: a tight hand-written prototype of the same work, in plain Python.

A ratio is taken within each repeat (the sides of one repeat ran under the same load)
and printed as median (min-max) over the repeats: "vs vLLM" is vLLM's time over ours
(above 1: we are ahead), "of floor" is the floor's time over ours (1: at the floor).
``--markdown`` prints the summary table that docs/performance.md and the README carry.

Run it in vLLM's environment with this checkout first on the path::

    PYTHONPATH=. /path/to/vllm-venv/bin/python benchmarks/bench_vllm.py [--repeat 7] [--markdown]

The P step (full scan, plain dict renewals) is ``bench_step.py``: it needs no vLLM.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import logging
import random
import statistics
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from time import perf_counter, thread_time_ns
from typing import Any

from _common import load, machine, table

from leaseproto import HeartbeatTracker, LeaseConfig, LeaseTable, wire
from leaseproto.core import renewal

CFG = LeaseConfig()
EXT = CFG.lease_extension
Side = Callable[[], float]  # runs one batch, returns its thread CPU ns per unit


def _vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - only in vLLM's environment
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: PLC0415
            base_scheduler,
            base_worker,
            stats,
        )
    except ImportError as exc:
        sys.exit(f"bench_vllm needs vLLM 0.32 importable (run it in vLLM's venv): {exc}")
    if not vllm.__version__.startswith("0.32"):
        sys.exit(f"bench_vllm compares against vLLM 0.32, found {vllm.__version__}")
    # the reaper logs a WARNING per expired lease: its formatting and I/O are left out
    logging.getLogger(base_worker.__name__).setLevel(logging.ERROR)
    return base_worker, base_scheduler, stats


class Stub:
    """The ``self`` vLLM's methods are called on: just the attributes they read."""


def run(sides: dict[str, Side], repeat: int) -> dict[str, list[float]]:
    """Each side's per-unit ns in each repeat, the sides taking turns (order rotating)."""
    names = list(sides)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        gc.collect()
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(sides[name]())
    return out


def ids_(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)  # vLLM-shaped P ids, 54 bytes
    return [f"chatcmpl-{rng.getrandbits(128):032x}-{i:08x}" for i in range(n)]


def _cpu(fn: Callable[[], object], units: int) -> float:
    c0 = thread_time_ns()
    fn()
    return (thread_time_ns() - c0) / units


# -- heartbeat handling on P --------------------------------------------------------------
def _no_renewals(*args: object) -> int:
    return 0


def heartbeat(
    bw: Any, max_bytes: int, n: int = 10_000, rounds: int = 5, *, checks_only: bool = False
) -> Sidesets:
    """``checks_only``: ours without the renewals themselves (``renewal.renew_ids``
    answers 0): what the call, the decode, the lookups and the checks cost alone."""
    ids = ids_(n)
    msgs = wire.encode_heartbeat(ids, max_bytes=max_bytes)
    ours = LeaseTable(CFG)
    for rid in ids:
        ours.grant(rid, now=0.0)
    w = Stub()
    w._reqs_to_send = dict.fromkeys(ids, perf_counter() + 30.0)  # type: ignore[attr-defined]
    w._lease_extension = int(EXT)  # type: ignore[attr-defined]
    handle = bw.NixlBaseConnectorWorker._handle_heartbeat.__get__(w)
    floor_dl = dict.fromkeys(ids, 30.0)
    clock = iter(range(1, 1 << 30))

    def side_ours() -> None:
        loop = renewal.renew_ids
        if checks_only:
            renewal.renew_ids = _no_renewals  # type: ignore[assignment]
        try:
            for _ in range(rounds):
                now = next(clock) * 1e-3
                for m in msgs:
                    ours.renew_heartbeat(m, now=now)
        finally:
            renewal.renew_ids = loop

    def side_vllm() -> None:
        for _ in range(rounds):
            for notif in msgs:  # pull_worker.py 652-659 (_get_new_notifs' dispatch)
                msg = notif.decode("utf-8")
                if msg.startswith("HB:"):
                    handle(msg[3:])

    def side_floor() -> None:
        dl = floor_dl
        for _ in range(rounds):
            now = next(clock) * 1e-3
            new = now + EXT
            for m in msgs:
                if m.startswith(b"HB:"):
                    for rid in m[3:].decode().split(","):
                        d = dl.get(rid)
                        if d is not None and now < d < new:  # live (I2), never shorter (I1)
                            dl[rid] = new

    total = n * rounds
    return {
        "ours": lambda: _cpu(side_ours, total),
        "vllm": lambda: _cpu(side_vllm, total),
        "floor": lambda: _cpu(side_floor, total),
    }


Sidesets = dict[str, Side]


# -- D: due() with nothing due ---------------------------------------------------------------
def due(calls: int = 20_000) -> Sidesets:
    tr = HeartbeatTracker(CFG)
    for i in range(1000):
        tr.track(f"r{i:06d}-local", engine_id=f"e{i % 100}", now=0.0)
    tr.due(now=0.0)
    s = Stub()
    s._heartbeat_by_engine = {"e": object()}  # type: ignore[attr-defined]
    s._last_heartbeat_time = 0.0  # type: ignore[attr-defined]
    s._heartbeat_interval = CFG.heartbeat_interval  # type: ignore[attr-defined]

    def vllm_due(self: Any, now: float) -> None:
        # base_scheduler.py 507-512 (build_connector_meta), the clock read moved to the
        # caller as for ours
        if self._heartbeat_by_engine:  # noqa: SIM102 - vLLM's code as it is
            if now - self._last_heartbeat_time >= self._heartbeat_interval:
                self._last_heartbeat_time = now
                self.heartbeat_by_engine = self._heartbeat_by_engine

    class Floor:
        def __init__(self) -> None:
            self._last = 0.0
            self._next_at = CFG.heartbeat_interval

        def due(self, *, now: float) -> dict[str, list[str]]:
            if self._last <= now < self._next_at:
                self._last = now
                return {}
            raise AssertionError("due")

    fl = Floor()
    nows = [1.0 + i * 1e-7 for i in range(calls)]
    batch = iter(range(1, 1 << 30))  # each batch's nows after the last's, all before 5 s

    def timed(which: str) -> Side:
        def side() -> float:
            base = next(batch) * 0.01
            todo = [t + base for t in nows]  # made before the clock starts
            c0 = thread_time_ns()
            if which == "ours":
                d = tr.due
                for now in todo:
                    d(now=now)
            elif which == "vllm":
                for now in todo:
                    vllm_due(s, now)
            else:
                d = fl.due
                for now in todo:
                    d(now=now)
            return (thread_time_ns() - c0) / calls

        return side

    if tr.due(now=1.0):
        raise AssertionError("due")
    return {"ours": timed("ours"), "vllm": timed("vllm"), "floor": timed("floor")}


# -- D: payloads ------------------------------------------------------------------------------
def payloads(n: int, max_bytes: int, times: int = 200) -> Sidesets:
    ids = ids_(n)
    tr = HeartbeatTracker(CFG)
    for k, rid in enumerate(ids):
        tr.track(f"local-{k}", engine_id="p", remote_req_id=rid, now=0.0)
    mine = tr.due(now=0.0)["p"]  # the list D's worker hands payloads(): an engine's ids
    if mine != ids:
        sys.exit("due() returned other ids")
    as_set = set(ids)
    hb = wire.HEARTBEAT_PREFIX
    room = max_bytes - len(hb)
    if tr.payloads(ids, max_bytes=max_bytes) != wire.encode_heartbeat(ids, max_bytes=max_bytes):
        sys.exit("payloads differ from encode_heartbeat")

    def floor_one(ids: list[str]) -> list[bytes]:
        return [hb + ",".join(ids).encode()]

    def floor_split(ids: list[str]) -> list[bytes]:
        data = ",".join(ids).encode()
        out, start, end = [], 0, len(data)
        while end - start > room:
            cut = data.rfind(b",", start, start + room + 1)
            out.append(hb + data[start:cut])
            start = cut + 1
        out.append(hb + data[start:])
        return out

    fl = floor_one if n * 55 <= room else floor_split
    if fl(ids) != wire.encode_heartbeat(ids, max_bytes=max_bytes):
        sys.exit("the floor's payloads differ")

    def side_ours() -> None:
        p = tr.payloads
        for _ in range(times):
            p(mine, max_bytes=max_bytes)

    def side_vllm() -> None:
        for _ in range(times):
            ("HB:" + ",".join(as_set)).encode()  # base_worker.py 3203 (_send_heartbeats)

    def side_floor() -> None:
        for _ in range(times):
            fl(ids)

    u = n * times
    return {
        "ours": lambda: _cpu(side_ours, u),
        "vllm": lambda: _cpu(side_vllm, u),
        "floor": lambda: _cpu(side_floor, u),
    }


# -- D: track + untrack ---------------------------------------------------------------------
class Request:
    __slots__ = ("kv_transfer_params", "request_id")

    def __init__(self, rid: str, remote: str, engine: str) -> None:
        self.request_id = rid
        self.kv_transfer_params = {
            "do_remote_prefill": True,
            "remote_engine_id": engine,
            "remote_request_id": remote,
            "remote_host": "10.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        }


def _remote(request: Request) -> tuple[str, str] | None:
    """The reads vLLM's ``on_new_request`` makes, for ours and the floor: the engine and
    remote id of a request to heartbeat, or ``None``."""
    params = request.kv_transfer_params
    if params is None or not params.get("do_remote_prefill"):
        return None
    engine = params.get("remote_engine_id")
    remote = params.get("remote_request_id")
    host, port = params.get("remote_host"), params.get("remote_port")
    tp = params.get("tp_size")
    params.get("dcp_size", 1), params.get("pp_size", 1)
    if engine is None or remote is None or host is None or port is None or tp is None:
        return None
    return engine, remote  # type: ignore[return-value]


def track(bs: Any, n: int = 10_000) -> Sidesets:
    reqs = [Request(f"cmpl-{r}-local", r, f"engine-{i % 100}") for i, r in enumerate(ids_(n))]
    rids = [r.request_id for r in reqs]
    tr = HeartbeatTracker(CFG)
    s = Stub()
    s._heartbeat_by_engine = {}  # type: ignore[attr-defined]
    s._heartbeat_req_engine = {}  # type: ignore[attr-defined]
    on_new = bs.NixlBaseConnectorScheduler.on_new_request.__get__(s)
    stop = bs.NixlBaseConnectorScheduler._stop_heartbeat.__get__(s)
    clock = iter(range(1, 1 << 30))

    def ours_track(request: Request, now: float) -> None:
        got = _remote(request)
        if got is not None:
            tr.track(request.request_id, engine_id=got[0], remote_req_id=got[1], now=now)

    by_engine: dict[str, dict[str, str]] = {}
    engine_of: dict[str, str] = {}

    def floor_track(request: Request) -> None:
        got = _remote(request)
        if got is None:
            return
        engine, remote = got
        if not (  # the id check, at its cheapest
            type(remote) is str
            and 2 < len(remote) <= CFG.max_id_bytes
            and remote.isascii()
            and remote.isprintable()
            and "," not in remote
        ):
            raise ValueError(remote)
        rid = request.request_id
        if rid in engine_of:
            raise ValueError(rid)
        mine = by_engine.get(engine)
        if mine is None:
            mine = by_engine[engine] = {}
        mine[rid] = remote
        engine_of[rid] = engine

    def floor_untrack(rid: str) -> None:
        engine = engine_of.pop(rid, None)
        if engine is not None:
            mine = by_engine[engine]
            del mine[rid]
            if not mine:
                del by_engine[engine]

    def side_ours() -> None:
        now = float(next(clock))
        for r in reqs:
            ours_track(r, now)
        for rid in rids:
            tr.untrack(rid)

    def side_vllm() -> None:
        for r in reqs:
            on_new(r)
        for rid in rids:
            stop(rid)

    def side_floor() -> None:
        for r in reqs:
            floor_track(r)
        for rid in rids:
            floor_untrack(rid)

    return {
        "ours": lambda: _cpu(side_ours, n),
        "vllm": lambda: _cpu(side_vllm, n),
        "floor": lambda: _cpu(side_floor, n),
    }


# -- P: an expire burst -----------------------------------------------------------------------
def expire(
    bw: Any,
    st: Any,
    live: int = 100_000,
    due_n: int = 10_000,
    *,
    spread: bool,
    records: bool = False,
) -> Sidesets:
    """``due_n`` of ``live`` leases come due in one call; ``spread``: each at its own
    deadline (granted at its own ``now``), else all at one; ``records``: ours reads every
    :class:`Release` (built when read), else the released ids."""
    ids = ids_(live)
    due_ids = ids[:: live // due_n][:due_n]
    due_set = set(due_ids)

    def side_ours() -> float:
        # the leases that come due granted for kv_lease_duration (what P grants), the
        # others for longer: P's workload, where a longer deadline is a renewed lease's
        t = LeaseTable(CFG)
        for i, rid in enumerate(ids):
            now = i * 1e-6 if spread else 0.0
            t.grant(rid, now=now, ttl=None if rid in due_set else 1000.0)
        out: list[Any] = []
        if records:  # each Release read too
            cpu = _cpu(lambda: out.extend(t.expire(now=CFG.kv_lease_duration + 1.0)), due_n)
        else:  # the released ids, what vLLM's reaper gives its caller
            cpu = _cpu(lambda: out.extend(t.expire(now=CFG.kv_lease_duration + 1.0).ids), due_n)
        if len(out) != due_n or {getattr(r, "req_id", r) for r in out} != due_set:
            sys.exit("ours released the wrong leases")
        return cpu

    def side_vllm() -> float:
        w = Stub()
        now = perf_counter()
        w._reqs_to_send = {  # type: ignore[attr-defined]
            rid: (now - 1.0 - i * 1e-6 if spread else now - 1.0) if rid in due_set else now + 1e6
            for i, rid in enumerate(ids)
        }
        w._reqs_to_process = set(ids)  # type: ignore[attr-defined]
        w.consumer_notification_counts_by_req = {}  # type: ignore[attr-defined]
        w.expected_consumer_notifications_by_req = {}  # type: ignore[attr-defined]
        w.xfer_stats = st.NixlKVConnectorStats()  # type: ignore[attr-defined]
        reap = bw.NixlBaseConnectorWorker._reap_expired_send_leases.__get__(w)
        done: set[str] = set()
        cpu = _cpu(lambda: reap(done), due_n)
        if done != due_set:
            sys.exit("vLLM released the wrong leases")
        return cpu

    def side_floor() -> float:
        live_: dict[str, float] = {}
        buckets: dict[float, list[str]] = {}
        for i, rid in enumerate(ids):
            d = (i * 1e-6 if spread else 0.0) + (10.0 if rid in due_set else 1000.0)
            live_[rid] = d
            buckets.setdefault(d, []).append(rid)
        keys = list(buckets)
        heapq.heapify(keys)
        ended: dict[str, tuple[str, float]] = {}

        def pop(now: float = 20.0) -> list[str]:  # pop the due buckets, end each lease
            out: list[str] = []
            while keys and keys[0] <= now:
                for rid in buckets.pop(heapq.heappop(keys)):
                    if live_.pop(rid, None) is not None:
                        out.append(rid)
            tomb = ("expired", now)
            for rid in out:
                ended[rid] = tomb
            return out

        res: list[str] = []
        cpu = _cpu(lambda: res.extend(pop()), due_n)
        if set(res) != due_set:
            sys.exit("the floor released the wrong leases")
        return cpu

    return {"ours": side_ours, "vllm": side_vllm, "floor": side_floor}


# -- P: memory per live lease -----------------------------------------------------------------
def memory(n: int = 100_000, per_step: int = 1) -> dict[str, float]:
    """Bytes per lease (``tracemalloc``; the ids themselves not counted) after ``n``
    grants, ``per_step`` of them at each ``now`` (0.1 ms apart)."""
    ids = ids_(n)

    def measure(build: Callable[[], object]) -> float:
        gc.collect()
        tracemalloc.start()
        keep = build()
        size, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del keep
        return size / n

    def ours() -> object:
        t = LeaseTable(CFG)
        now = 0.0
        for i, rid in enumerate(ids):
            if i % per_step == 0:  # P reads its clock once per step
                now = (i // per_step) * 1e-4
            t.grant(rid, now=now)
        return t

    def vllm() -> object:  # pull_worker.py 96 and 119 (start_load_kv)
        to_send: dict[str, float] = {}
        to_process: set[str] = set()
        for rid in ids:
            to_process.add(rid)
            to_send[rid] = perf_counter() + 30.0
        return to_send, to_process

    def floor() -> object:
        return {rid: (i // per_step) * 1e-4 + 30.0 for i, rid in enumerate(ids)}

    return {"ours": measure(ours), "vllm": measure(vllm), "floor": measure(floor)}


# -- the report -------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def summarise(res: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    o, v, f = res["ours"], res["vllm"], res["floor"]
    return {
        "ours": spread(o),
        "vllm": spread(v),
        "floor": spread(f),
        "vs_vllm": spread([b / a for a, b in zip(o, v, strict=True)]),
        "of_floor": spread([b / a for a, b in zip(o, f, strict=True)]),
    }


def fmt_ns(t: tuple[float, float, float]) -> str:
    return (
        f"{t[1]:,.0f} ({t[0]:,.0f}-{t[2]:,.0f})"
        if t[1] >= 10
        else f"{t[1]:.1f} ({t[0]:.1f}-{t[2]:.1f})"
    )


def fmt_x(t: tuple[float, float, float]) -> str:
    return f"{t[1]:.2f}x ({t[0]:.2f}-{t[2]:.2f})"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="repeats per row (>= 5)")
    ap.add_argument("--markdown", action="store_true", help="print only the summary table")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    args = ap.parse_args(argv)
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    bw, bs, st = _vllm()
    rows: list[tuple[str, str, Callable[[], Sidesets]]] = [
        ("hb512", "heartbeat handling, 512 B messages (ns per id)", lambda: heartbeat(bw, 512)),
        (
            "hb512_checks",
            "heartbeat handling, 512 B, ours without the renewals (ns per id; a limit)",
            lambda: heartbeat(bw, 512, checks_only=True),
        ),
        ("hb4k", "heartbeat handling, 4 KiB messages (ns per id)", lambda: heartbeat(bw, 4096)),
        (
            "hb1",
            "heartbeat handling, one large message (ns per id)",
            lambda: heartbeat(bw, 1 << 20),
        ),
        ("due", "D `due()`, nothing due (ns per call)", due),
        ("pay10", "D payload, 10 ids in one message (ns per id)", lambda: payloads(10, 4096)),
        (
            "pay1k",
            "D payload, 1,000 ids in one message (ns per id)",
            lambda: payloads(1000, 1 << 16),
        ),
        (
            "split",
            "D payload, 1,000 ids split at 512 B (ns per id; vLLM never splits)",
            lambda: payloads(1000, 512),
        ),
        ("track", "D track + untrack (ns per request)", lambda: track(bs)),
        (
            "expire",
            "expire burst, 10k of 100k, one deadline (ns per released lease)",
            lambda: expire(bw, st, spread=False),
        ),
        (
            "expire_spread",
            "expire burst, 10k of 100k, each its own deadline (ns per released lease)",
            lambda: expire(bw, st, spread=True),
        ),
        (
            "expire_records",
            "expire burst, one deadline, each `Release` read (ns per released lease)",
            lambda: expire(bw, st, spread=False, records=True),
        ),
    ]
    wanted = set(filter(None, args.rows.split(",")))
    header = f"{machine()}; {load()}; {args.repeat} repeats, thread CPU time, sides interleaved"
    out = []
    for key, label, make in rows:
        if wanted and key not in wanted:
            continue
        s = summarise(run(make(), args.repeat))
        out.append(
            [
                label,
                fmt_ns(s["ours"]),
                fmt_ns(s["vllm"]),
                fmt_ns(s["floor"]),
                fmt_x(s["vs_vllm"]),
                fmt_x(s["of_floor"]),
            ]
        )
        if not args.markdown:
            print(out[-1], flush=True)
    if not wanted or "memory" in wanted:
        for per_step, what in ((1, "each granted alone"), (16, "16 grants per step")):
            m = memory(per_step=per_step)
            out.append(
                [
                    f"memory per live lease, 100k, {what} (B)",
                    f"{m['ours']:.0f}",
                    f"{m['vllm']:.0f}",
                    f"{m['floor']:.0f}",
                    f"{m['vllm'] / m['ours']:.2f}x",
                    f"{m['floor'] / m['ours']:.2f}x",
                ]
            )
    print(
        f"\nleaseproto against vLLM {sys.modules['vllm'].__version__}'s own code; {header}; "
        "median (min-max) over repeats; ratios per repeat: vs vLLM = vLLM / ours, "
        "of floor = floor / ours\n"
    )
    print(table(["path", "leaseproto", "vLLM 0.32", "floor", "vs vLLM", "of floor"], out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
