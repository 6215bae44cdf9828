"""Cross-check in virtual time: vLLM 0.32's own scheduler and worker lease code against
LeaseprotoConnector's, driven through the same hypothesis-generated schedules.

A world is one D engine (scheduler + worker) and one to three P engines (a worker
each), on a virtual ``time.perf_counter`` and a recording NIXL wrapper that carries
the exact bytes. Each tick (0.5 s): D's scheduler builds its metadata and D's worker
runs vLLM's ``start_load_kv`` (heartbeats); then each P worker runs ``start_load_kv``
(grants, rebased as vLLM does), handles its notifications and reaps, in vLLM's order.
Requests arrive (granted on P, queued on D), wait in D's queue, and are read (a
transfer-done ``<id>:1``); D may stall (no steps) or die. Lease durations include
values that are and are not multiples of 6.

The stock world and ours must agree on every release (reason and time) and on the
heartbeat bytes, except the documented differences (docs/vllm.md):

* ours gives each P engine its own turn (an engine seen for the first time, or again
  after all its requests left, is heartbeated at once; vLLM waits for its one global
  timer): where the heartbeats are byte-identical the releases must be identical, and
  otherwise no id's heartbeat is later than vLLM's and no lease expires in ours that
  does not expire in vLLM's;
* a heartbeat that reaches P at or after a lease's deadline renews it in vLLM and not
  in ours (the lease has lapsed): such a lease is *excused* from the comparison;
* a transfer-done after expiry: vLLM logs an unrecognized request (the READ was of
  freed blocks, served silently); ours knows the lease expired and counts a late read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from hypothesis import event, given, settings
from hypothesis import strategies as st
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlConnectorMetadata,
)
from vllm_stubs import d_request, make_scheduler, make_worker, worker_stat

pytestmark = pytest.mark.vllm

TICK = 0.5
T0 = 1000.0


@dataclass(frozen=True)
class Req:
    pid: str
    engine: str
    arrive: float  # granted on P and queued on D at this tick
    wait: float  # time in D's queue before the READ


@dataclass(frozen=True)
class Schedule:
    duration: int
    engines: int
    reqs: tuple[Req, ...]
    stall: tuple[float, float] | None  # D takes no step in [a, b)
    death: float | None  # D takes no step from here on
    horizon: float


@st.composite
def schedules(draw: Any) -> Schedule:
    duration = draw(st.sampled_from([6, 7, 12, 13, 30]))
    engines = draw(st.integers(1, 3))
    n = draw(st.integers(1, 6))
    reqs = tuple(
        Req(
            f"cmpl-{i}-{i:08x}",
            f"P{draw(st.integers(0, engines - 1))}",
            draw(st.integers(0, 4 * duration)) * TICK,
            draw(st.integers(0, 6 * duration)) * TICK,
        )
        for i in range(n)
    )
    stall = None
    if draw(st.booleans()):
        a = draw(st.integers(0, 4 * duration)) * TICK
        stall = (a, a + draw(st.integers(1, 3 * duration)) * TICK)
    death = draw(st.none() | st.integers(0, 8 * duration).map(lambda k: k * TICK))
    horizon = max(r.arrive + r.wait for r in reqs) + 3 * duration
    return Schedule(duration, engines, reqs, stall, death, horizon)


@dataclass
class Outcome:
    releases: dict[str, tuple[str, float]] = field(default_factory=dict)
    heartbeats: list[tuple[float, str, frozenset[str]]] = field(default_factory=list)
    late: list[str] = field(default_factory=list)  # transfer-done for an expired lease
    excused: set[str] = field(default_factory=set)
    late_reads: int = 0
    after_expiry: int = 0


def run(s: Schedule, ours: bool, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    clock = {"t": T0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    engines = [f"P{i}" for i in range(s.engines)]
    d_sched = make_scheduler(ours, kv_lease_duration=s.duration)
    d_work = make_worker(
        ours,
        kv_lease_duration=s.duration,
        agents={e: {(0, 0): f"agent-{e}"} for e in engines},
    )
    p_work = {e: make_worker(ours, kv_lease_duration=s.duration) for e in engines}
    out = Outcome()
    ended: set[str] = set()
    read: set[str] = set()
    ticks = int(s.horizon / TICK) + 1
    for k in range(ticks):
        clock["t"] = T0 + k * TICK
        now = k * TICK  # schedule time; the clock runs T0 ahead (vLLM starts its timer at 0)
        d_up = (s.death is None or now < s.death) and not (
            s.stall is not None and s.stall[0] <= now < s.stall[1]
        )
        if d_up:
            for r in s.reqs:
                if r.arrive == now:
                    d_sched.on_new_request(d_request("d-" + r.pid, r.pid, engine=r.engine))
            meta = d_sched.build_connector_meta(MagicMock())
            d_work.start_load_kv(meta)
            for r in s.reqs:
                if r.pid not in read and r.arrive + r.wait <= now and r.arrive < now:
                    read.add(r.pid)  # the READ; its notification rides on it
                    d_work.nixl_wrapper.send_notif(f"agent-{r.engine}", f"{r.pid}:1".encode())
                    d_sched._stop_heartbeat("d-" + r.pid)
            for agent, msg in d_work.nixl_wrapper.sent:
                engine = agent.removeprefix("agent-")
                if msg.startswith(b"HB:"):
                    ids = frozenset(msg[3:].decode().split(","))
                    out.heartbeats.append((now, engine, ids))
                    w = p_work[engine]
                    for pid in ids:  # a renewal vLLM grants and the core refuses
                        d = w._reqs_to_send.get(pid)
                        if d is not None and d <= clock["t"]:
                            out.excused.add(pid)
                elif msg.split(b":")[0].decode() in ended:
                    out.late.append(msg.split(b":")[0].decode())
                p_work[engine].nixl_wrapper.deliver("d-agent", msg)
            d_work.nixl_wrapper.sent.clear()
        for e, w in p_work.items():
            grants = [r.pid for r in s.reqs if r.arrive == now and r.engine == e]
            if grants:
                pmeta = NixlConnectorMetadata()
                pmeta.reqs_in_batch = set(grants)
                pmeta.reqs_to_send = {pid: clock["t"] + s.duration for pid in grants}
                pmeta.scheduler_clock = clock["t"]
                w.start_load_kv(pmeta)
            before = len(w.xfer_stats.data["num_kv_expired_reqs"])
            live = set(w._reqs_to_send)
            done = w._get_new_notifs()
            transferred = set(done)
            w._reap_expired_send_leases(done)
            expired = (done - transferred) & live
            assert len(w.xfer_stats.data["num_kv_expired_reqs"]) - before == len(expired)
            for pid in done:
                out.releases[pid] = ("expired" if pid in expired else "transferred", now)
                ended.add(pid)
    for w in p_work.values():
        out.late_reads += worker_stat(w, "lp_late_reads")
        out.after_expiry += len(w.xfer_stats.data["num_notifications_after_expiry"])
    return out


def covered(stock: Outcome, ours: Outcome, s: Schedule, excused: set[str]) -> None:
    """Each id in a stock heartbeat (t, engine) that D tracked since before t - H was
    also in one of ours for that engine within (t - H, t]: per-engine turns never send
    a heartbeat later than vLLM's global timer."""
    h = s.duration // 6
    since = {r.pid: r.arrive for r in s.reqs}
    for t, engine, ids in stock.heartbeats:
        for pid in ids:
            if since[pid] >= t - h or pid in excused:
                continue
            assert any(
                e == engine and t - h < t2 <= t and pid in ids2 for t2, e, ids2 in ours.heartbeats
            ), (t, engine, pid)


@settings(max_examples=200, deadline=None)
@given(s=schedules())
def test_stock_and_leaseproto_agree(s: Schedule) -> None:
    with pytest.MonkeyPatch.context() as mp:
        stock = run(s, False, mp)
        ours = run(s, True, mp)
    excused = stock.excused | ours.excused
    same_bytes = ours.heartbeats == stock.heartbeats
    event("identical heartbeats" if same_bytes else "per-engine turns differ")
    if not same_bytes:
        covered(stock, ours, s, excused)
    for r in s.reqs:
        if r.pid in excused:
            continue
        if same_bytes:
            assert ours.releases.get(r.pid) == stock.releases.get(r.pid), r
        elif ours.releases.get(r.pid, ("", 0))[0] == "expired":
            assert stock.releases.get(r.pid, ("", 0))[0] == "expired", r
    # every transfer-done after expiry: vLLM served the READ of freed blocks silently
    # (an "unrecognized request"); ours recognises each as a late read
    assert ours.late_reads == len(ours.late) <= ours.after_expiry
    if same_bytes and not excused:
        assert ours.late == stock.late and stock.after_expiry == len(stock.late)


def test_a_stall_past_the_extension_is_a_silent_read_on_stock_and_a_late_read_on_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stall of docs/vllm.md's real engines, as one schedule: D stalls past the
    extension while a request waits, P frees the blocks, D reads them when it wakes up."""
    s = Schedule(12, 1, (Req("cmpl-0-00000000", "P0", 1.0, 12.0),), (4.0, 16.0), None, 60.0)
    stock = run(s, False, monkeypatch)
    ours = run(s, True, monkeypatch)
    assert stock.releases == ours.releases == {"cmpl-0-00000000": ("expired", 13.0)}
    assert stock.late == ours.late == ["cmpl-0-00000000"]
    assert stock.after_expiry == 1 and ours.late_reads == 1
    assert SimpleNamespace(a=stock.heartbeats) == SimpleNamespace(a=ours.heartbeats)
