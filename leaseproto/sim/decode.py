"""The router and the decode side of a simulated fleet (see :mod:`.fleet`).

:class:`DecodeSide` holds the handlers of D's events: a request reaching D, D's
heartbeats, its scheduling step, reads, decodes, crashes and restarts; and the
notifications D sends to P. :class:`~leaseproto.sim.fleet.FleetRun` builds the
state they use and runs them.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from ..core import wire
from ..core.table import LeaseTable
from ..core.tracker import HeartbeatTracker
from .engines import DEngine, PEngine, grid
from .figures import Figures
from .policy import Policy
from .workload import Scenario, Workload

__all__ = ["DecodeSide", "Handler"]

# request stages
_PREFILL, _AT_D, _READING, _DECODING, _LOST = 1, 2, 3, 4, 5
# event priorities at one instant: P handles notifications, then expires
_NOTIFY, _EXPIRE, _OTHER = 0, 1, 2

Handler = Callable[[float, Any], None]


class DecodeSide:
    """The router's and D's handlers; the state is :class:`FleetRun`'s."""

    sc: Scenario
    wl: Workload
    policy: Policy
    fig: Figures
    ps: list[PEngine]
    ds: list[DEngine]
    p_inbox: dict[str, tuple[float, LeaseTable]]
    p_of: list[int]
    stage: list[int]
    d_arrival: list[float]
    lost_at: list[float]
    net: random.Random
    _heap: list[tuple[float, int, int, Handler, Any]]
    _seq: itertools.count[int]
    _rr: int
    _waits: list[float]
    _hb_msgs: int
    _hb_bytes: int
    _hb_msgs_window: int
    _hb_bytes_window: int
    #: (delay_base, delay_jitter, p_step, max_notification_bytes): a heartbeat's trip
    _hb_net: tuple[float, float, float, int]
    _h_p_transfer_done: Handler
    _h_p_heartbeat: Handler
    _h_d_heartbeat: Handler
    _h_d_schedule: Handler
    _h_d_read_done: Handler
    _h_d_decoded: Handler

    def _at(self, t: float, handler: Handler, arg: Any, prio: int = _OTHER) -> None:
        heapq.heappush(self._heap, (t, prio, next(self._seq), handler, arg))

    def _new_tracker(self) -> HeartbeatTracker | None:
        return HeartbeatTracker(self.policy.config) if self.policy.heartbeats else None

    def _send_transfer_done(self, p: PEngine, t: float, i: int) -> None:
        # D's transfer-done of request i to P (its delay as in _d_heartbeat's loop); the
        # event names i too, so P finds the request without looking its id up
        sc = self.sc
        msg = wire.encode_transfer_done(self.wl.rid[i], 1)
        arrive = t + sc.delay_base + self.net.random() * sc.delay_jitter
        b = grid(arrive, sc.p_step, p.phase)
        heapq.heappush(
            self._heap, (b, _NOTIFY, next(self._seq), self._h_p_transfer_done, (p.table, msg, i))
        )

    def _route(self) -> DEngine:
        ds = self.ds
        n = len(ds)
        rr = self._rr
        d = ds[rr]
        if d.router_up:  # the usual case: the next one is up
            self._rr = rr + 1 if rr + 1 < n else 0
            return d
        for k in range(1, n):
            d = ds[(rr + k) % n]
            if d.router_up:
                self._rr = (rr + k + 1) % n
                return d
        self._rr = (rr + 1) % n
        return ds[rr]

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
        step = d.step_at(t, self.sc.d_step)
        tr = d.tracker
        if tr is not None:
            engine = self.ps[self.p_of[i]].name
            tr.track(self.wl.rid[i], engine_id=engine, now=t)
            if engine not in d.hs:
                d.hs[engine] = ready = t + self.sc.handshake
                d.hs_wait[engine] = ready
                self._want_hb(d, d.step_at(ready, self.sc.d_step))
            nxt = tr.next_due()
            self._want_hb(d, step if nxt is None or nxt <= t else d.step_at(nxt, self.sc.d_step))
        if d.running < self.sc.d_slots:
            self._want_sched(d, step)

    def _want_hb(self, d: DEngine, b: float) -> None:
        if b not in d.hb_times:
            d.hb_times.add(b)
            heapq.heappush(
                self._heap, (b, _OTHER, next(self._seq), self._h_d_heartbeat, (d, d.epoch))
            )

    def _want_sched(self, d: DEngine, b: float) -> None:
        if b not in d.sched_times:
            d.sched_times.add(b)
            heapq.heappush(
                self._heap, (b, _OTHER, next(self._seq), self._h_d_schedule, (d, d.epoch))
            )

    def _d_heartbeat(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, epoch = arg
        if epoch != d.epoch:
            return
        d.hb_times.discard(t)
        tr = d.tracker
        assert tr is not None
        if not len(tr):
            return  # nothing tracked: nothing is due, and nothing will be until a track
        pending = d.hs_wait  # the handshakes not done by now
        if pending:
            for engine in [e for e, ready in pending.items() if ready <= t]:
                del pending[engine]
        due = tr.due(now=t, pending=pending)
        heap = self._heap
        seq = self._seq
        if due:
            # what our decode worker sends (payloads: encode_heartbeat's bytes), each
            # arriving at P's next step boundary after its delay (_send, written out:
            # the heartbeats are most of a busy fleet's messages)
            sent, jitter, period, max_bytes = self._hb_net
            rnd = self.net.random
            notify = self._h_p_heartbeat
            inbox = self.p_inbox
            ids_sent = msgs = size = 0
            for engine, ids in due.items():
                phase, table = inbox[engine]
                ids_sent += len(ids)
                for msg in tr.payloads(ids, max_bytes=max_bytes):
                    msgs += 1
                    size += len(msg)
                    arrive = t + sent + rnd() * jitter
                    b = phase + math.ceil((arrive - phase) / period) * period  # grid()
                    if b < arrive:
                        b += period
                    heapq.heappush(heap, (b, _NOTIFY, next(seq), notify, (table, msg)))
            self.fig.hb_ids += ids_sent
            self._hb_msgs += msgs
            self._hb_bytes += size
            if t <= self.sc.duration:
                self._hb_msgs_window += msgs
                self._hb_bytes_window += size
        nxt = tr.next_due()
        if nxt is not None:  # due but pending: try again next step
            b = d.step_at(nxt if nxt > t else t + 1e-9, self.sc.d_step)
            if b not in d.hb_times:  # _want_hb, written out
                d.hb_times.add(b)
                heapq.heappush(heap, (b, _OTHER, next(seq), self._h_d_heartbeat, arg))

    def _d_schedule(self, t: float, arg: tuple[DEngine, int]) -> None:
        d, epoch = arg
        if epoch != d.epoch:
            return
        d.sched_times.discard(t)
        for start, end in d.hangs:
            if start <= t < end:
                self._want_sched(d, d.step_at(end, self.sc.d_step))
                return
        slots = self.sc.d_slots
        waiting = d.waiting
        if d.running < slots and waiting:
            stage = self.stage
            waits = self._waits
            d_arrival = self.d_arrival
            read_s = self.wl.read_s
            heap = self._heap
            seq = self._seq
            done = self._h_d_read_done
            while d.running < slots and waiting:
                i = waiting.popleft()
                stage[i] = _READING
                d.reading[i] = None
                d.running += 1
                waits.append(t - d_arrival[i])
                heapq.heappush(heap, (t + read_s[i], _OTHER, next(seq), done, (d, epoch, i)))

    def _d_read_done(self, t: float, arg: tuple[DEngine, int, int]) -> None:
        d, epoch, i = arg
        if epoch != d.epoch:
            return  # D crashed mid-read: the request was lost with it
        del d.reading[i]
        self.stage[i] = _DECODING
        wl = self.wl
        rid = wl.rid[i]
        if d.tracker is not None:
            d.tracker.untrack(rid)
        self._send_transfer_done(self.ps[self.p_of[i]], t, i)
        heapq.heappush(
            self._heap, (t + wl.decode_s[i], _OTHER, next(self._seq), self._h_d_decoded, arg)
        )

    def _d_decoded(self, t: float, arg: tuple[DEngine, int, int]) -> None:
        d, epoch, _ = arg
        if epoch != d.epoch:
            return
        d.running -= 1
        if d.waiting:
            self._want_sched(d, d.step_at(t, self.sc.d_step))

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
        d.hs_wait.clear()
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
