"""A fleet of P and D engines stepping in virtual time around the real core.

Every lease decision is made by the real :class:`LeaseTable` (one per P
engine), every heartbeat schedule by the real :class:`HeartbeatTracker` (one per
D engine, replaced when D restarts), and every message crosses
:mod:`leaseproto.wire`: D encodes with ``max_bytes`` and P decodes what
arrives. This module only decides *when* things happen:

* requests arrive (Poisson, with surges), queue at the least busy P, are
  prefilled one at a time, and P grants the lease when prefill ends;
* the router forwards each to a D (round robin over the D engines it believes
  alive) after ``router_transit``; D tracks it on entering its waiting queue,
  schedules it at a step boundary when a running slot frees, reads its blocks,
  untracks it and notifies P (transfer-done), then decodes it;
* D calls ``due`` on its step boundaries; steps are ``d_step`` apart except
  during forward-pass stalls, which delay heartbeats; a P engine D has not
  talked to yet needs a ``handshake`` first (passed to ``due`` as pending);
* notifications take ``delay_base + uniform(0, delay_jitter)`` and P handles
  them on its next step boundary, then runs ``expire`` in the same step;
* a crashed D loses its queue, running set and tracker; the router keeps
  sending to it for ``router_detect`` seconds; it restarts empty.

Event-driven: a P step where no notification arrives and no deadline falls
due changes nothing in the table, so only steps where something happens are
simulated.

Simplifications, each the same for every policy: P's KV pool is unbounded
(held blocks are reported, not enforced); a request whose lease expired while
D still needed it is counted, and D still reads it (a naive D; ours would be
NACKed and prefill again, which the figures count instead of simulating);
the router spreads requests round robin over the D engines it believes alive.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from ..core import wire
from ..core.events import LateTransfer, Release, ReleaseReason
from ..core.tracker import HeartbeatTracker
from .engines import DEngine, PEngine, grid
from .figures import Figures, Series, percentile
from .policy import Policy
from .workload import Workload

__all__ = ["FleetRun"]

# request stages
_PREFILL, _AT_D, _READING, _DECODING, _LOST = 1, 2, 3, 4, 5
# event priorities at one instant: P handles notifications, then expires
_NOTIFY, _EXPIRE, _OTHER = 0, 1, 2

Handler = Callable[[float, Any], None]


class FleetRun:
    """One policy on one workload. :meth:`run` returns its figures and series.

    After :meth:`run`, ``release_of[i]`` is request ``i``'s :class:`Release`
    and ``lost_at[i]`` the death time of the D that stranded it (``nan`` if
    none): the tests check them against the timing rules.
    """

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        *,
        sample_dt: float | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.wl = workload
        self.sc = sc = workload.scenario
        self.policy = policy
        self.sample_dt = sample_dt if sample_dt is not None else max(sc.duration / 600.0, 0.1)
        self.progress = progress
        n = len(workload)
        self.ps = [PEngine(i, policy, workload.p_phase[i]) for i in range(sc.p_engines)]
        self.p_by_name = {p.name: p for p in self.ps}
        # len(queue) + busy of each P engine, by index: the router's choice is the
        # first engine with the least load (what min over (load, index) picks)
        self._p_load = [0] * sc.p_engines
        self.ds = [
            DEngine(
                i,
                workload.d_phase[i],
                workload.stalls[i],
                [(h.at, h.at + h.length) for h in sc.hangs if h.engine == i],
            )
            for i in range(sc.d_engines)
        ]
        for d in self.ds:
            d.tracker = self._new_tracker()
        self.idx_of = {rid: i for i, rid in enumerate(workload.rid)}
        self.stage = [0] * n
        self.p_of = [0] * n
        self.d_arrival = [math.nan] * n
        self.lost_at = [math.nan] * n
        self.release_of: list[Release | None] = [None] * n
        self.fig = Figures(policy.name, requests=n)
        self.series = Series()
        self.net = random.Random(workload.seed * 1_000_003 + 7)
        self._heap: list[tuple[float, int, int, Handler, Any]] = []
        self._seq = itertools.count()
        self._rr = 0
        self._held = 0
        self._area = 0.0
        self._area_t = 0.0
        self._waits: list[float] = []
        self._hb_msgs = self._hb_bytes = self._hb_msgs_window = self._hb_bytes_window = 0

    # -- plumbing -----------------------------------------------------------------------
    def _new_tracker(self) -> HeartbeatTracker | None:
        return HeartbeatTracker(self.policy.config) if self.policy.heartbeats else None

    def _at(self, t: float, handler: Handler, arg: Any, prio: int = _OTHER) -> None:
        heapq.heappush(self._heap, (t, prio, next(self._seq), handler, arg))

    def _d_step(self, d: DEngine, t: float) -> float:
        return d.step_at(t, self.sc.d_step)

    def _p_step(self, p: PEngine, t: float) -> float:
        return grid(t, self.sc.p_step, p.phase)

    def _send(self, p: PEngine, t: float, msg: bytes) -> None:
        sc = self.sc
        arrive = t + sc.delay_base + self.net.random() * sc.delay_jitter
        self._at(self._p_step(p, arrive), self._p_notify, (p, msg), _NOTIFY)

    def _held_change(self, t: float, delta: int) -> None:
        end = self.sc.duration
        if self._area_t < end:
            upto = min(t, end)
            self._area += self._held * (upto - self._area_t)
            self._area_t = upto
        self._held += delta
        self.fig.p_blocks_peak = max(self.fig.p_blocks_peak, self._held)

    # -- run ----------------------------------------------------------------------------
    def run(self) -> tuple[Figures, Series]:
        sc = self.sc
        for i, t in enumerate(self.wl.arrival):
            self._at(t, self._arrive, i)
        for crash in sc.crashes:
            self._at(crash.at, self._crash, (self.ds[crash.engine], crash.down_for))
        self._at(0.0, self._sample, None)
        heap = self._heap
        pop = heapq.heappop
        events = 0
        t = 0.0
        while heap:
            t, _, _, handler, arg = pop(heap)
            handler(t, arg)
            events += 1
            if self.progress is not None and not events & 0x3FFF:
                self.progress(t)
        self._finish(events)
        return self.fig, self.series

    def _finish(self, events: int) -> None:
        fig = self.fig
        sc = self.sc
        self._held_change(sc.duration, 0)
        fig.p_blocks_mean = self._area / sc.duration
        fig.events = events
        for p in self.ps:
            st = p.table.stats
            fig.granted += st.granted
            fig.renewals += st.renewed
            fig.released_transferred += st.released_transferred
            fig.released_expired += st.released_expired
            fig.released_aborted += st.released_aborted
            fig.late_reads += st.late_transfers
        fig.hb_msgs_per_s = self._hb_msgs_window / sc.duration
        fig.hb_bytes_per_s = self._hb_bytes_window / sc.duration
        fig.hb_bytes_per_renewal = (self._hb_bytes / fig.renewals) if fig.renewals else None
        dtr = fig.death_to_release
        fig.death_to_release_p50 = percentile(dtr, 50)
        fig.death_to_release_p99 = percentile(dtr, 99)
        fig.death_to_release_max = max(dtr) if dtr else None
        fig.d_wait_p99 = percentile(self._waits, 99)
        fig.end_time = max((r.at for r in self.release_of if r is not None), default=0.0)

    def _sample(self, t: float, _: Any) -> None:
        s = self.series
        s.t.append(t)
        s.p_blocks.append(self._held)
        s.live_leases.append(sum(len(p.table) for p in self.ps))
        s.d_waiting.append(sum(len(d.waiting) for d in self.ds))
        s.hb_msgs.append(self._hb_msgs)
        busy = (
            t < self.sc.duration
            or s.live_leases[-1]
            or s.d_waiting[-1]
            or any(p.busy or p.queue for p in self.ps)
        )
        if busy:
            self._at(t + self.sample_dt, self._sample, None)

    # -- prefill side -------------------------------------------------------------------
    def _arrive(self, t: float, i: int) -> None:
        loads = self._p_load
        k = loads.index(min(loads))
        loads[k] += 1
        p = self.ps[k]
        self.p_of[i] = p.index
        self.stage[i] = _PREFILL
        p.queue.append(i)
        self._p_start(p, t)

    def _p_start(self, p: PEngine, t: float) -> None:
        if p.busy or not p.queue:
            return
        i = p.queue.popleft()
        p.busy = True
        self._at(t + self.wl.prefill_s[i], self._prefilled, (p, i))

    def _prefilled(self, t: float, arg: tuple[PEngine, int]) -> None:
        p, i = arg
        p.busy = False
        self._p_load[p.index] -= 1
        p.table.grant(self.wl.rid[i], now=t, ttl=self.policy.ttl)
        self._held_change(t, self.wl.blocks[i])
        self._want_expire(p)
        d = self._route()
        self.stage[i] = _AT_D
        self._at(t + self.sc.router_transit, self._d_arrive, (d, i))
        self._p_start(p, t)

    def _want_expire(self, p: PEngine) -> None:
        nd = p.table.next_deadline()
        if nd is None:
            return
        b = self._p_step(p, nd)
        if b < p.expire_at:
            p.expire_at = b
            self._at(b, self._p_expire, p, _EXPIRE)

    def _p_expire(self, t: float, p: PEngine) -> None:
        if t >= p.expire_at:
            p.expire_at = math.inf
        for rel in p.table.expire(now=t):
            self._released(rel)
        self._want_expire(p)

    def _p_notify(self, t: float, arg: tuple[PEngine, bytes]) -> None:
        p, raw = arg
        msg = wire.decode(raw)  # the sim only sends well-formed messages
        if isinstance(msg, wire.Heartbeat):
            p.table.renew(msg.ids, now=t)
        elif isinstance(msg, wire.TransferDone):
            out = p.table.transfer_done(msg.req_id, now=t)
            if isinstance(out, Release):
                self._released(out)
            elif isinstance(out, LateTransfer):
                pass  # counted by the table (stats.late_transfers)

    def _released(self, rel: Release) -> None:
        i = self.idx_of[rel.req_id]
        blocks = self.wl.blocks[i]
        self._held_change(rel.at, -blocks)
        self.release_of[i] = rel
        fig = self.fig
        lost = self.lost_at[i]
        if not math.isnan(lost):
            fig.stranded_block_s += blocks * (rel.at - max(rel.granted_at, lost))
            fig.death_to_release.append(rel.at - lost)
        elif rel.reason is ReleaseReason.EXPIRED and self.stage[i] in (_AT_D, _READING):
            fig.expired_while_needed += 1

    # -- router and decode side ---------------------------------------------------------
    def _route(self) -> DEngine:
        ds = self.ds
        n = len(ds)
        for k in range(n):
            d = ds[(self._rr + k) % n]
            if d.router_up:
                self._rr = (self._rr + k + 1) % n
                return d
        d = ds[self._rr % n]
        self._rr = (self._rr + 1) % n
        return d

    def _lose(self, i: int, at: float) -> None:
        self.stage[i] = _LOST
        self.lost_at[i] = at
        self.fig.stranded += 1

    def _d_arrive(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, i = arg
        if not d.alive:
            self._lose(i, d.dead_since)
            return
        self.d_arrival[i] = t
        d.waiting.append(i)
        tr = d.tracker
        if tr is not None:
            engine = self.ps[self.p_of[i]].name
            tr.track(self.wl.rid[i], engine_id=engine, now=t)
            if engine not in d.hs:
                d.hs[engine] = t + self.sc.handshake
                self._want_hb(d, self._d_step(d, t + self.sc.handshake))
            nxt = tr.next_due()
            self._want_hb(d, self._d_step(d, t if nxt is None or nxt <= t else nxt))
        if d.running < self.sc.d_slots:
            self._want_sched(d, self._d_step(d, t))

    def _want_hb(self, d: DEngine, b: float) -> None:
        if b not in d.hb_times:
            d.hb_times.add(b)
            self._at(b, self._d_heartbeat, (d, d.epoch))

    def _want_sched(self, d: DEngine, b: float) -> None:
        if b not in d.sched_times:
            d.sched_times.add(b)
            self._at(b, self._d_schedule, (d, d.epoch))

    def _d_heartbeat(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, epoch = arg
        if epoch != d.epoch:
            return
        d.hb_times.discard(t)
        tr = d.tracker
        assert tr is not None
        pending = [e for e, ready in d.hs.items() if ready > t]
        max_bytes = self.policy.config.max_notification_bytes
        in_window = t <= self.sc.duration
        for engine, ids in tr.due(now=t, pending=pending).items():
            p = self.p_by_name[engine]
            self.fig.hb_ids += len(ids)
            for msg in wire.encode_heartbeat(ids, max_bytes=max_bytes):
                self._hb_msgs += 1
                self._hb_bytes += len(msg)
                if in_window:
                    self._hb_msgs_window += 1
                    self._hb_bytes_window += len(msg)
                self._send(p, t, msg)
        nxt = tr.next_due()
        if nxt is not None:  # due but pending: try again next step
            self._want_hb(d, self._d_step(d, nxt if nxt > t else t + 1e-9))

    def _d_schedule(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, epoch = arg
        if epoch != d.epoch:
            return
        d.sched_times.discard(t)
        for start, end in d.hangs:
            if start <= t < end:
                self._want_sched(d, self._d_step(d, end))
                return
        slots = self.sc.d_slots
        while d.running < slots and d.waiting:
            i = d.waiting.popleft()
            self.stage[i] = _READING
            d.reading[i] = None
            d.running += 1
            self._waits.append(t - self.d_arrival[i])
            self._at(t + self.wl.read_s[i], self._d_read_done, (d, epoch, i))

    def _d_read_done(self, t: float, arg: tuple[DEngine, int, int]) -> None:
        d, epoch, i = arg
        if epoch != d.epoch:
            return  # D crashed mid-read: the request was lost with it
        del d.reading[i]
        self.stage[i] = _DECODING
        rid = self.wl.rid[i]
        if d.tracker is not None:
            d.tracker.untrack(rid)
        self._send(self.ps[self.p_of[i]], t, wire.encode_transfer_done(rid, 1))
        self._at(t + self.wl.decode_s[i], self._d_decoded, (d, epoch, i))

    def _d_decoded(self, t: float, arg: tuple[DEngine, int, int]) -> None:
        d, epoch, _ = arg
        if epoch != d.epoch:
            return
        d.running -= 1
        if d.waiting:
            self._want_sched(d, self._d_step(d, t))

    def _crash(self, t: float, arg: tuple[DEngine, float]) -> None:
        d, down_for = arg
        if not d.alive:
            return
        d.alive = False
        d.epoch += 1
        d.dead_since = t
        for i in itertools.chain(d.waiting, d.reading):
            self._lose(i, t)
        d.waiting.clear()
        d.reading.clear()
        d.running = 0
        d.tracker = None
        d.hs.clear()
        d.hb_times.clear()
        d.sched_times.clear()
        self._at(t + self.sc.router_detect, self._router_down, (d, d.epoch))
        self._at(t + down_for, self._restart, d)

    def _router_down(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, epoch = arg
        if d.epoch == epoch and not d.alive:
            d.router_up = False

    def _restart(self, t: float, d: DEngine) -> None:
        d.alive = True
        d.epoch += 1
        d.dead_since = math.nan
        d.tracker = self._new_tracker()
        d.router_up = True
