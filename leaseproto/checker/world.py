"""One state of the checked world: the real core objects plus the checker's ghosts.

P ranks are real :class:`~leaseproto.LeaseTable` s, D's leader runs a real
:class:`~leaseproto.HeartbeatTracker`, and every notification is real bytes
made and parsed by :mod:`leaseproto.core.wire`. What is written here is only
the glue a worker adds around them (spec §7-§8: P answers each transfer-done
with the verdict :func:`~leaseproto.core.wire.verdict` picks, each lost
heartbeat id with ``LL``; D uses a read only once every verdict is ``OK``) and
*ghost* state, the ground truth the invariants of :mod:`.invariants` are judged
against (which lease instances are live, how each ended, what every read saw).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

from ..core import wire
from ..core.clock import ClockOffset
from ..core.events import Release
from ..core.table import LeaseTable
from ..core.tracker import HeartbeatTracker
from ..workers import verdicts
from . import giveups, glue
from . import invariants as inv
from .clone import clone_table, clone_tracker
from .compaction import EagerQueue
from .fingerprint import world_fingerprint
from .ghosts import Action, Instance, Msg, Violation
from .moves import Moves
from .scope import Scope

__all__ = ["MIRRORED", "Action", "Instance", "Msg", "Violation", "World"]

#: the ids a violation in the turn-2 scope is reported by (spec §9: I14-I16 are I13,
#: I8/I11 and I5/I6 for the leases D grants)
MIRRORED = {"I13": "I14", "I5": "I16", "I6": "I16", "I8": "I16", "I11": "I16"}


class World(Moves):
    """The mutable world; :meth:`copy` before :meth:`apply` to branch."""

    #: violations reported by the mirrored ids in scopes with ``mirror``, and the case
    mirrored = MIRRORED
    case = "turn 2"

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.cfg = scope.config
        # P: the grantor ranks (tables), D: the reader's ranks (tracker); named by
        # role in the turn-2 scope, where D grants and P reads (spec §2.8)
        grantor, reader = ("D", "P") if scope.mirror else ("P", "D")
        self.P = [f"{grantor}{i}" for i in range(scope.p_ranks)]
        self.D = [f"{reader}{i}" for i in range(scope.d_ranks)]
        #: the grant's ttl: P's L, or D's decoder_kv_blocks_ttl for a cached turn
        self.ttl = self.cfg.decoder_kv_blocks_ttl if scope.mirror else self.cfg.kv_lease_duration
        self.R = [f"r{i}" for i in range(scope.requests)]
        self.now = 0
        self.tables = {p: self.new_table() for p in self.P}
        self.tracker = HeartbeatTracker(self.cfg)
        #: in flight, to be decided at the next instant
        self.net: list[Msg] = []
        #: in flight, not yet decided at this instant
        self.undecided: list[Msg] = []
        #: arrived, handled at the receiver's next turn
        self.inbox: dict[str, list[Msg]] = {}
        #: whose turn it is at this instant: P ranks by index, then D
        self.turn = 0
        self.d_received = False
        self.granted_now: dict[str, set[str]] = {}
        #: ghost: when D last put a heartbeat to each engine on the wire (its tracker's now)
        self.last_hb: dict[str, float] = {}
        self.budget = {
            "loss": scope.losses,
            "dup": scope.dups,
            "pause": 1 if scope.d_pause else 0,
            "restart": scope.p_restarts,
            "reconnect": scope.reconnects,
            "regrant": scope.regrants,
        }
        self.d_alive = True
        self.paused_until = -1
        self.pending: set[str] = set()
        #: §5's assumptions broken in this run (a pause, a restart, a lost
        #: connection): I8 is not claimed then, every safety invariant still is
        self.broken = False
        # -- ghosts ----------------------------------------------------------------------
        self.inst: dict[tuple[str, str], list[Instance]] = {}
        self.staged: dict[tuple[str, str], int] = {}
        self.staged_abort: set[tuple[str, str]] = set()
        #: P's count of dropped staged notifications when (p, r) was first staged
        self.staged_mark: dict[tuple[str, str], int] = {}
        #: the tombstones P must keep (spec §6.3): per rank, id -> (reason, ended_at)
        self.tombs: dict[str, OrderedDict[str, tuple[str, int]]] = {
            p: OrderedDict() for p in self.P
        }
        self.first_grant: dict[str, int] = {}
        #: D's view of each request: new | tracked | done | failed | aborted | crashed
        self.phase = dict.fromkeys(self.R, "new")
        self.reads: dict[tuple[str, str, str], bool] = {}  # (r, d, p) -> blocks live at the read
        #: per (request, D rank): the P ranks whose verdict its reads still wait for
        self.due: dict[tuple[str, str], set[str]] = {}
        #: D's clock samples of each P engine (scopes with ``gate``), and when it sent its hello
        self.clocks: dict[str, ClockOffset] = {}
        self.hello: dict[str, int] = {}
        # -- the router's give-ups (scope ``router``, :mod:`.giveups`) ---------------------
        #: request -> (the instant the router gave up on it, the ranks I17 exempts)
        self.gave_up: dict[str, tuple[int, frozenset[str]]] = {}
        #: the router's aborts on their way to each P rank and to D (the control plane)
        self.ctl: dict[str, list[str]] = {}
        #: (rank, request): the rank's prefill was dropped (failed, or aborted first)
        self.cancelled: set[tuple[str, str]] = set()
        #: the requests the router handed to D (kept in scopes with ``router`` only)
        self.routed: set[str] = set()

    def new_table(self) -> LeaseTable:
        """A rank's table (with a queue compacted early in scopes with a slack)."""
        table = LeaseTable(self.cfg)
        if self.scope.compaction_slack is not None:
            table._queue = EagerQueue(self.scope.compaction_slack)
        return table

    def d_clock(self, t: float) -> float:
        """D's clock at grid instant ``t`` (P's clock is ``t + skew``)."""
        return self.scope.d_rate * t

    def reader_now(self) -> float:
        """The ``now`` the reader's tracker runs on: the grid, or the reader's own
        drifting clock in scopes with ``reader_clock``."""
        return self.d_clock(self.now) if self.scope.reader_clock else float(self.now)

    # -- hooks of the push world (:mod:`.push_world`); here they do nothing -----------------
    def on_completion(self, p: str, src: str, r: str, *, ok: bool, live: bool) -> None:
        """Grantor ``p`` handled ``src``'s transfer-done for ``r`` and answered ``ok``
        (``live``: the ghost's lease was live), before any release it caused."""

    def on_abort(self, p: str, src: str, r: str) -> None:
        """Grantor ``p`` handled ``src``'s abort of ``r``."""

    def reader_used(self, r: str) -> None:
        """Every verdict the reader waited for on ``r`` is OK: it uses its reads (I13)."""
        inv.check_use(self, r)

    def give_up(self, r: str) -> None:
        """An ``LL`` made the reader give up on ``r`` before any read."""
        self.untrack(r, "failed")

    def extra_fingerprint(self) -> tuple[object, ...]:
        """Further state a subclass keeps (part of :meth:`fingerprint`)."""
        return ()

    # -- branching ------------------------------------------------------------------------
    def copy(self) -> World:
        new = copy.copy(self)
        new.tables = {p: clone_table(t) for p, t in self.tables.items()}
        new.tracker = clone_tracker(self.tracker)
        new.net = list(self.net)
        new.undecided = list(self.undecided)
        new.inbox = {k: list(v) for k, v in self.inbox.items()}
        new.granted_now = {k: set(v) for k, v in self.granted_now.items()}
        new.last_hb = dict(self.last_hb)
        new.budget = dict(self.budget)
        new.pending = set(self.pending)
        new.inst = {k: [copy.copy(i) for i in v] for k, v in self.inst.items()}
        new.staged = dict(self.staged)
        new.staged_abort = set(self.staged_abort)
        new.staged_mark = dict(self.staged_mark)
        new.tombs = {p: OrderedDict(tb) for p, tb in self.tombs.items()}
        new.first_grant = dict(self.first_grant)
        new.phase = dict(self.phase)
        new.reads = dict(self.reads)
        new.due = {k: set(v) for k, v in self.due.items()}
        new.clocks = {p: copy.copy(c) for p, c in self.clocks.items()}
        new.hello = dict(self.hello)
        new.gave_up = dict(self.gave_up)
        new.ctl = {k: list(v) for k, v in self.ctl.items()}
        new.cancelled = set(self.cancelled)
        new.routed = set(self.routed)
        return new

    def live_inst(self, p: str, r: str) -> Instance | None:
        insts = self.inst.get((p, r))
        return insts[-1] if insts and insts[-1].live else None

    # -- applying -------------------------------------------------------------------------
    def apply(self, act: Action) -> None:
        """Take ``act``; raises :class:`Violation` when an invariant fails."""
        name, *args = act
        try:
            getattr(self, "_do_" + name)(*args)
            inv.check_state(self, act)
        except Violation as v:
            if self.scope.mirror and v.inv in self.mirrored:
                new = self.mirrored[v.inv]
                raise Violation(new, f"{self.case} ({v.inv} mirrored): {v.text}") from v
            raise

    def _do_arrive(self, i: int) -> None:
        m = self.undecided.pop(i)
        self.inbox.setdefault(m.dst, []).append(m)

    def _do_hold(self, i: int) -> None:
        self.net.append(self.undecided.pop(i))

    def _do_lose(self, i: int) -> None:
        self.budget["loss"] -= 1
        del self.undecided[i]

    def _do_dup(self, i: int) -> None:
        self.budget["dup"] -= 1
        self.undecided.append(self.undecided[i])

    def send(self, src: str, dst: str, data: bytes) -> None:
        self.net.append(Msg(src, dst, data, self.now))

    def _do_tick(self) -> None:
        self.now += 1
        self.turn = 0
        self.d_received = False
        self.granted_now = {}
        self.undecided, self.net = self.net, []

    def _do_grant(self, p: str, r: str) -> None:
        self.granted_now.setdefault(p, set()).add(r)
        insts = self.inst.setdefault((p, r), [])
        if insts:
            self.budget["regrant"] -= 1
        table = self.tables[p]
        # staged notifications P may forget (staging_ttl, capacity): checked only if none was
        dropped = self.staged_mark.pop((p, r), table.stats.early_dropped)
        res = table.grant(r, now=float(self.now), consumers=self.scope.consumers, ttl=self.ttl)
        inst = Instance(tds=self.staged.pop((p, r), 0), granted_at=self.now)
        insts.append(inst)
        self.tombs[p].pop(r, None)
        self.first_grant.setdefault(r, self.now)
        aborted = (p, r) in self.staged_abort
        self.staged_abort.discard((p, r))
        if isinstance(res, Release):
            self.released(p, r, res)
        lossless = table.stats.early_dropped == dropped
        if aborted and inst.live and lossless:
            raise Violation("I2", f"{r} on {p}: D's abort, staged before the grant, was ignored")
        if inst.tds >= self.readers() and inst.live and lossless:
            raise Violation(
                "I10", f"{r} on {p}: {inst.tds} staged transfer-dones did not complete it"
            )

    def _do_regrant(self, p: str, r: str) -> None:
        """A grant of an id whose last lease on ``p`` ended (its own label in traces)."""
        self._do_grant(p, r)

    def released(self, p: str, r: str, rel: Release) -> None:
        inst = self.live_inst(p, r)
        if inst is None:
            raise Violation("I3", f"{r} on {p} released again ({rel.reason.value})")
        inv.check_release(self, p, r, inst, rel)
        inst.live = False
        inst.reason = rel.reason.value
        inst.ended_at = self.now
        tombs = self.tombs[p]
        tombs[r] = (inst.reason, self.now)
        tombs.move_to_end(r)
        while len(tombs) > self.cfg.tombstone_capacity:
            tombs.popitem(last=False)

    def _do_p_step(self, p: str) -> None:
        """P's loop step: every arrived notification, then expire, then the
        ``next_deadline()`` it wakes at (workers/prefill.py, spec §9.2). Scopes
        without ``wakes`` ask a copy: the query requeues renewed leases as it goes,
        which would spare ``expire`` the lazy requeue it must get right on its own."""
        self.turn += 1
        table = self.tables[p]
        giveups.at_p(self, p)  # the router's aborts (scope ``router``)
        for m in self.inbox.pop(p, []):
            glue.at_p(self, p, m)
        for rel in table.expire(now=float(self.now)):
            self.released(p, rel.req_id, rel)
        inv.check_wake(self, p, (table if self.scope.wakes else clone_table(table)).next_deadline())
        ttl = self.cfg.tombstone_ttl  # P prunes tombstones older than their ttl when it reaps
        tombs = self.tombs[p]
        for r in [r for r, (_, at) in tombs.items() if at + ttl <= self.now]:
            del tombs[r]
        inv.check_reaped(self, p)
        giveups.check_p(self, p)

    def _do_p_restart(self, p: str) -> None:
        self.budget["restart"] -= 1
        self.broken = True
        self.tables[p] = self.new_table()
        self.inbox.pop(p, None)
        for (q, _), insts in self.inst.items():
            if q == p and insts and insts[-1].live:
                insts[-1].live, insts[-1].reason, insts[-1].ended_at = False, "restart", self.now
        self.tombs[p].clear()
        for key in [k for k in self.staged if k[0] == p]:
            del self.staged[key]
        self.staged_abort = {k for k in self.staged_abort if k[0] != p}
        self.staged_mark = {k: v for k, v in self.staged_mark.items() if k[0] != p}

    def untrack(self, r: str, phase: str) -> None:
        self.phase[r] = phase
        for d in self.D:
            self.due.pop((r, d), None)
        for p in self.P:
            self.tracker.untrack(f"{r}@{p}")

    def _do_d_recv(self) -> None:
        """D's loop, first part: every arrived verdict and lease-lost."""
        self.d_received = True
        for d in self.D:
            for m in self.inbox.pop(d, []):
                glue.at_d(self, d, m)
        giveups.at_d(self)  # the router's aborts (scope ``router``)
        giveups.check_d(self)

    def _do_route(self, r: str) -> None:
        self.phase[r] = "tracked"
        if self.scope.router:
            self.routed.add(r)
        for d in self.D:
            self.due[(r, d)] = set(self.P)
        for p in self.P:
            self.tracker.track(f"{r}@{p}", engine_id=p, remote_req_id=r, now=self.reader_now())

    def _do_d_step(self) -> None:
        """D's heartbeat step: ``due``, each engine's heartbeat onto the wire."""
        due = self.tracker.due(now=self.reader_now(), pending=self.pending)
        for engine, ids in due.items():
            self.last_hb[engine] = self.reader_now()
            for payload in wire.encode_heartbeat(ids, max_bytes=self.cfg.max_notification_bytes):
                self.send(self.D[0], engine, payload)
        for engine in [e for e in self.last_hb if e not in self.tracker.engines()]:
            del self.last_hb[engine]
        inv.check_schedule(self)
        self._do_tick()

    def _do_read(self, r: str, d: str, p: str) -> None:
        if self.scope.gate:
            glue.check_gated_read(self, r, p)
        held = r in self.tables[p] or not self.inst.get((p, r))
        self.reads[(r, d, p)] = held
        self.send(d, p, wire.encode_transfer_done(r, self.readers()))

    def readers(self) -> int:
        """The ``n`` each D rank's transfer-done names (the decode worker's fan-out)."""
        return verdicts.readers_per_p_rank(len(self.D), len(self.P))

    def _do_hello(self, p: str) -> None:
        """D's first contact with P: a clock sample request (§8.7's handshake)."""
        self.hello[p] = self.now
        self.send(self.D[0], p, glue.HELLO)

    def _do_abort(self, r: str) -> None:
        self.untrack(r, "aborted")
        for p in self.P:
            self.send(self.D[0], p, wire.encode_abort(r))

    def abort_request(self, r: str) -> None:
        """D aborts ``r`` (its own decision, or the router's abort)."""
        self._do_abort(r)

    def _do_give_up(self, r: str, cause: str, rank: int | None) -> None:
        giveups.do_give_up(self, r, cause, rank)

    def _do_refuse(self, r: str) -> None:
        giveups.refuse(self, r)

    def _do_d_crash(self) -> None:
        self.d_alive = False
        self.tracker = HeartbeatTracker(self.cfg)
        self.last_hb = {}
        self.due = {}  # D's memory of its reads is gone
        for r, ph in self.phase.items():
            if ph in ("new", "tracked"):
                self.phase[r] = "crashed"
        self._do_tick()

    def _do_d_pause(self) -> None:
        self.budget["pause"] -= 1
        self.broken = True
        self.paused_until = self.now + self.scope.d_pause
        self._do_tick()

    def _do_disconnect(self, p: str) -> None:
        self.budget["reconnect"] -= 1
        self.broken = True
        self.pending.add(p)

    def _do_reconnect(self, p: str) -> None:
        self.pending.discard(p)

    # -- canonical fingerprint ------------------------------------------------------------
    def fingerprint(self) -> bytes:
        return world_fingerprint(self)
