"""P's hot paths for ``benchmarks/bench_vllm.py``: heartbeat handling, an expire
burst, and memory per live lease, each as ours, vLLM's and the floor."""

from __future__ import annotations

import gc
import heapq
import sys
import tracemalloc
from collections.abc import Callable
from time import perf_counter
from typing import Any

from _three_sides import CFG, Sidesets, Stub, _cpu, ids_

from leaseproto import LeaseTable, wire
from leaseproto.core import renewal

EXT = CFG.lease_extension


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
