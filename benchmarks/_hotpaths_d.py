"""D's hot paths for ``benchmarks/bench_vllm.py``: ``due()`` with nothing due, heartbeat
payloads, and track + untrack, each as ours, vLLM's and the floor."""

from __future__ import annotations

import sys
from time import thread_time_ns
from typing import Any

from _three_sides import CFG, Side, Sidesets, Stub, _cpu, ids_

from leaseproto import HeartbeatTracker, wire


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
                fd = fl.due
                for now in todo:
                    fd(now=now)
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
