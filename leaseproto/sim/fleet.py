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
simulated. Events are plain tuples ``(t, priority, seq, handler, arg)`` in one
heap; the arrivals, already sorted, are read beside it. D's handlers are in
:mod:`.decode`. ``tests/test_sim_golden.py`` pins the results of small runs.

Simplifications, each the same for every policy: P's KV pool is unbounded
(held blocks are reported, not enforced); a request whose lease expired while
D still needed it is counted, and D still reads it (a naive D; ours would be
NACKed and prefill again, which the figures count instead of simulating);
the router spreads requests round robin over the D engines it believes alive.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from ..core import wire
from ..core.events import Release, ReleaseReason
from ..core.table import LeaseTable
from .decode import _AT_D, _EXPIRE, _OTHER, _PREFILL, _READING, DecodeSide, Handler
from .engines import DEngine, PEngine, grid
from .figures import Figures, Series, percentile
from .policy import Policy
from .workload import Workload

__all__ = ["FleetRun"]


class FleetRun(DecodeSide):
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
        # P engine name -> (phase of its step grid, its table): where a heartbeat goes
        self.p_inbox = {p.name: (p.phase, p.table) for p in self.ps}
        # len(queue) + busy of each P engine, by index: the router's choice is the
        # first engine with the least load (what min over (load, index) picks)
        self._p_load = [0] * sc.p_engines
        self._p_order = [(0, k) for k in range(sc.p_engines)]
        self._p_order_max = 4 * sc.p_engines + 64
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
        self._peak = 0
        self._end = sc.duration
        self._area = 0.0
        self._area_t = 0.0
        self._waits: list[float] = []
        self._hb_msgs = self._hb_bytes = self._hb_msgs_window = self._hb_bytes_window = 0
        self._hb_net = (
            sc.delay_base,
            sc.delay_jitter,
            sc.p_step,
            policy.config.max_notification_bytes,
        )
        # the handlers, bound once
        self._h_prefilled: Handler = self._prefilled
        self._h_d_arrive: Handler = self._d_arrive
        self._h_p_expire: Handler = self._p_expire
        self._h_p_transfer_done: Handler = self._p_transfer_done
        self._h_p_heartbeat: Handler = self._p_heartbeat
        self._h_d_heartbeat: Handler = self._d_heartbeat
        self._h_d_schedule: Handler = self._d_schedule
        self._h_d_read_done: Handler = self._d_read_done
        self._h_d_decoded: Handler = self._d_decoded

    # -- plumbing -----------------------------------------------------------------------
    def _held_change(self, t: float, delta: int) -> int:
        """Add ``delta`` blocks held from ``t`` on; returns the blocks held now.
        (The area under the curve stops at the end of the arrivals window.)"""
        area_t = self._area_t
        held = self._held
        if area_t < self._end:
            upto = t if t < self._end else self._end
            self._area += held * (upto - area_t)
            self._area_t = upto
        held = self._held = held + delta
        return held

    # -- run ----------------------------------------------------------------------------
    def run(self) -> tuple[Figures, Series]:
        for crash in self.sc.crashes:
            self._at(crash.at, self._crash, (self.ds[crash.engine], crash.down_for))
        self._at(0.0, self._sample, None)
        heap = self._heap
        arrivals = self.wl.arrival
        progress = self.progress
        # The run makes no reference cycles (tests/test_sim.py checks that it leaves no
        # cyclic garbage): reference counting frees all it drops, and the cyclic
        # collector would only walk the growing records again and again.
        collecting = gc.isenabled()
        gc.disable()
        try:
            events = self._loop(heap, arrivals, progress)
        finally:
            if collecting:
                gc.enable()
        self._finish(events)
        return self.fig, self.series

    def _loop(
        self,
        heap: list[tuple[float, int, int, Handler, Any]],
        arrivals: list[float],
        progress: Callable[[float], None] | None,
    ) -> int:
        """Handle every event, in order; returns how many.

        The arrivals are sorted: they are read in order beside the heap instead of
        being pushed into it (a heap of every request would make each pop cost
        log2(requests)). An arrival goes first at its instant unless a notification
        or an expiry is due then: in one heap, arrivals (priority _OTHER) would
        carry the smallest sequence numbers, as they would be pushed first."""
        pop = heapq.heappop
        arrive = self._arrive
        n = len(arrivals)
        inf = math.inf
        nxt = 0
        ta = arrivals[0] if n else inf
        events = 0
        for events in itertools.count():  # the events handled before this one
            if heap:
                top = heap[0]
                t = top[0]
                if ta < t or (ta == t and top[1] == _OTHER):
                    t = ta
                    arrive(t, nxt)
                    nxt += 1
                    ta = arrivals[nxt] if nxt < n else inf
                else:
                    pop(heap)
                    top[3](t, top[4])
            elif nxt < n:
                t = ta
                arrive(t, nxt)
                nxt += 1
                ta = arrivals[nxt] if nxt < n else inf
            else:
                break
            if progress is not None and not events & 0x3FFF:
                progress(t)
        return events

    def _finish(self, events: int) -> None:
        fig = self.fig
        sc = self.sc
        self._held_change(sc.duration, 0)
        fig.p_blocks_peak = self._peak
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
        # the first engine with the least load: the top of a heap of (load, index)
        # entries in which an entry whose load is not the engine's load is stale
        loads = self._p_load
        order = self._p_order
        load, k = order[0]
        while loads[k] != load:
            heapq.heappop(order)
            load, k = order[0]
        loads[k] = load + 1
        heapq.heapreplace(order, (load + 1, k))
        p = self.ps[k]
        self.p_of[i] = k
        self.stage[i] = _PREFILL
        p.queue.append(i)
        if not p.busy:
            self._p_start(p, t)

    def _p_start(self, p: PEngine, t: float) -> None:
        if p.busy or not p.queue:
            return
        i = p.queue.popleft()
        p.busy = True
        heapq.heappush(
            self._heap,
            (t + self.wl.prefill_s[i], _OTHER, next(self._seq), self._h_prefilled, (p, i)),
        )

    def _prefilled(self, t: float, arg: tuple[PEngine, int]) -> None:
        p, i = arg
        p.busy = False
        k = p.index
        loads = self._p_load
        load = loads[k] = loads[k] - 1
        order = self._p_order
        heapq.heappush(order, (load, k))
        if len(order) > self._p_order_max:  # drop the stale entries
            order[:] = [(load, j) for j, load in enumerate(loads)]
            heapq.heapify(order)
        wl = self.wl
        rid = wl.rid[i]
        table = p.table
        table.grant(rid, now=t, ttl=self.policy.ttl)
        held = self._held_change(t, wl.blocks[i])
        self._peak = max(self._peak, held)  # only a grant can raise the peak
        # The table's earliest deadline is now the smaller of the one before and the new
        # lease's; an expiry is already due at or before the grid boundary of the one
        # before (p.expire_at), so only the new deadline can ask for an earlier one. This
        # leaves the table's lazy queue alone (next_deadline() walks and requeues the
        # renewed leases at its head: the costliest call of a busy fleet's grants).
        # (grid(deadline) >= deadline: a deadline at or after p.expire_at asks for nothing)
        deadline = table.deadline(rid)
        assert deadline is not None
        heap = self._heap
        seq = self._seq
        if deadline < p.expire_at:
            b = grid(deadline, self.sc.p_step, p.phase)
            if b < p.expire_at:
                p.expire_at = b
                heapq.heappush(heap, (b, _EXPIRE, next(seq), self._h_p_expire, p))
        self.stage[i] = _AT_D
        at = t + self.sc.router_transit
        heapq.heappush(heap, (at, _OTHER, next(seq), self._h_d_arrive, (self._route(), i)))
        if p.queue:
            self._p_start(p, t)

    def _want_expire(self, p: PEngine) -> None:
        # invariant: p.expire_at <= grid(p.table.next_deadline()) while a lease is live
        nd = p.table.next_deadline()
        if nd is None:
            return
        b = grid(nd, self.sc.p_step, p.phase)
        if b < p.expire_at:
            p.expire_at = b
            heapq.heappush(self._heap, (b, _EXPIRE, next(self._seq), self._h_p_expire, p))

    def _p_expire(self, t: float, p: PEngine) -> None:
        if t >= p.expire_at:
            p.expire_at = math.inf
        for rel in p.table.expire(now=t):
            self._released(rel, self.idx_of[rel.req_id])
        self._want_expire(p)

    def _p_heartbeat(self, t: float, arg: tuple[LeaseTable, bytes]) -> None:
        # what our prefill worker does with a heartbeat: decode and renew in one pass
        # (the same decisions as wire.decode then renew); the rest goes the long way
        # (a notification's event carries P's table: all P does with one is in it)
        table, raw = arg
        if table.renew_heartbeat(raw, now=t) is None:
            msg = wire.decode(raw)  # the sim only sends well-formed messages
            if type(msg) is wire.Heartbeat:
                table.renew(msg.ids, now=t)

    def _p_transfer_done(self, t: float, arg: tuple[LeaseTable, bytes, int]) -> None:
        # D's transfer-done of request i
        table, raw, i = arg
        msg = wire.decode(raw)  # the sim only sends well-formed messages
        assert type(msg) is wire.TransferDone
        out = table.transfer_done(msg.req_id, now=t)
        if type(out) is Release:
            self._released(out, i)
        # a LateTransfer is counted by the table (stats.late_transfers)

    def _released(self, rel: Release, i: int) -> None:
        # request i's lease ended
        blocks = self.wl.blocks[i]
        self._held_change(rel.at, -blocks)
        self.release_of[i] = rel
        lost = self.lost_at[i]
        if not math.isnan(lost):  # the request's D died
            fig = self.fig
            fig.stranded_block_s += blocks * (rel.at - max(rel.granted_at, lost))
            fig.death_to_release.append(rel.at - lost)
        elif rel.reason is ReleaseReason.EXPIRED and self.stage[i] in (_AT_D, _READING):
            self.fig.expired_while_needed += 1
