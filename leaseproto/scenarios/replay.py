"""The replay engine behind ``leaseproto replay`` (spec §12).

It drives the real :class:`~leaseproto.LeaseTable` (one per P rank), the real
:class:`~leaseproto.HeartbeatTracker` (D) and :mod:`leaseproto.wire` through a
scenario (:mod:`leaseproto.scenarios.format`) on one virtual timeline, and records what
they do as :class:`Event` values. Owns no clock: ``t`` comes from the file,
and each side's ``now`` is its clock's reading at ``t`` (``offset + rate * t``).

Order of things at one instant: messages that arrive at ``t`` land in their
inboxes first, then the lines at ``t`` run in file order (a periodic line at
the position of the line that declared it). P handles its inbox only in
``p_step``: every message in arrival order, then ``expire`` (as a P engine
step does). D's heartbeats leave in ``d_step`` and arrive ``delay`` later.
"""

from __future__ import annotations

import heapq

from ..core import wire
from ..core.errors import LocalProtocolError
from ..core.events import LateTransfer, Release, TransferCounted
from ..core.table import TableStats
from ..core.tracker import HeartbeatTracker
from .expect import check
from .format import Op, Scenario, ScenarioError, parse_scenario
from .reads import Reads
from .replay_state import TOL, Event, Rank, ReplayResult, World, fmt, show

__all__ = ["Event", "ReplayResult", "replay", "replay_text"]


class _Replay(Reads, World):
    # -- run ------------------------------------------------------------------------------
    def run(self) -> ReplayResult:
        while self.queue:
            t, prio, _, _, item = heapq.heappop(self.queue)
            self.t = t
            if prio == 0:
                ranks, payload, sent, line = item
                for r in ranks:
                    r.inbox.append((payload, sent, line))
                continue
            op, k = item
            self.line = op.line
            if "every" in op.args:
                nxt = op.t + (k + 1) * op.args["every"]
                if nxt <= op.args["until"] + TOL:
                    self._push(nxt, 1, op.line, (op, k + 1))
            try:
                getattr(self, "_op_" + op.op)(op)
            except ScenarioError as exc:
                self.result.error = exc
                return self.result
            except (LocalProtocolError, ValueError) as exc:
                self.result.error = ScenarioError(op.line, f"{op.op}: {exc}")
                return self.result
        self._summary()
        return self.result

    def _summary(self) -> None:
        for rs in self.ranks.values():
            for r in rs:
                s = r.table.stats
                left = len(r.inbox)
                self._emit(
                    r.name,
                    "end",
                    f"end: live [{', '.join(r.table.live())}]; released "
                    f"{s.released_transferred} transferred, {s.released_expired} expired, "
                    f"{s.released_aborted} aborted; nacks {len(r.nacks)}"
                    + (f"; {left} message(s) never handled (no later p_step)" if left else ""),
                    live=r.table.live(),
                    unhandled=left,
                )
        if self.tracker is not None:
            self._emit(
                self.R,
                "end",
                f"end: tracking [{', '.join(self.tracked())}]",
                tracked=self.tracked(),
            )
        self._emit(
            "-", "end", f"expects: {self.result.expects_ok} ok, {self.result.expects_failed} failed"
        )

    # -- P --------------------------------------------------------------------------------
    def _op_grant(self, op: Op) -> None:
        a = op.args
        for r in self._select(a["engine"], a.get("rank")):
            rel = r.table.grant(
                a["id"], now=self._now(self.G), consumers=a.get("consumers", 1), ttl=a.get("ttl")
            )
            info = r.table.lease_info(a["id"])
            deadline = info["deadline"] if info else rel.deadline if rel else None
            if deadline is not None:  # what the grantor exports (a turn-2 read's gate)
                r.exported[a["id"]] = deadline
            extra = f", consumers {a['consumers']}" if a.get("consumers", 1) != 1 else ""
            self._emit(
                r.name,
                "grant",
                f"grant {a['id']}: deadline {fmt(deadline)}{extra}",
                id=a["id"],
                deadline=deadline,
            )
            if rel is not None:
                self._release(r, rel, " at grant (staged early notification applied)")

    def _op_deliver(self, op: Op) -> None:
        a = op.args
        for r in self._select(a["engine"], a.get("rank")):
            r.inbox.append((a["msg"].encode("utf-8"), self.t, op.line))

    def _op_p_step(self, op: Op) -> None:
        for r in self._select(op.args.get("engine"), op.args.get("rank")):
            inbox, r.inbox = r.inbox, []
            for payload, sent, _ in inbox:
                self._handle(r, payload, sent)
            dropped = r.table.stats.early_dropped
            for rel in r.table.expire(now=self._now(self.G)):
                self._release(r, rel)
            dropped = r.table.stats.early_dropped - dropped
            if dropped:
                self._emit(
                    r.name,
                    "staging",
                    f"forgot {dropped} staged early notification(s) (staging_ttl)",
                )

    def _handle(self, r: Rank, payload: bytes, sent: float) -> None:
        now = self._now(self.G)
        tab = r.table
        try:
            msg = wire.decode(payload)
        except wire.MalformedMessage as exc:
            r.malformed += 1
            self._emit(r.name, "malformed", f"recv {show(payload)!s}: malformed, dropped ({exc})")
            return
        head = f"recv {show(payload)} (sent {fmt(sent)})"
        if isinstance(msg, wire.Heartbeat):
            outcomes: dict[str, list[str]] = {}  # what happened -> ids, in order
            answers: list[str] = []  # advisory lease-lost answers (spec §8.2)
            for rid in msg.ids:
                old = tab.deadline(rid)
                before = tab.stats
                lost: list[str] = []
                if tab.renew([rid], now=now, lost=lost):
                    new = tab.deadline(rid)
                    what = (
                        f"renewed {fmt(old)}->{fmt(new)}"
                        if new != old
                        else f"renewed, deadline stays {fmt(new)}"
                    )
                else:
                    what = _ignored(before, tab.stats)
                for gone in lost:
                    ll = wire.lease_lost(gone, tab.lost_reason(gone, now=now))
                    answers.append(wire.encode(ll)[0].decode())
                outcomes.setdefault(what, []).append(rid)
            text = "; ".join(f"{', '.join(ids)} {what}" for what, ids in outcomes.items())
            if answers:
                text += f"; {self.G} answers {', '.join(answers)} (advisory)"
            self._emit(r.name, "heartbeat", f"{head}: {text}", ids=list(msg.ids), lost=answers)
        elif isinstance(msg, wire.TransferDone):
            res = tab.transfer_done(msg.req_id, now=now, readers=msg.count)
            answer = wire.encode(wire.verdict(msg.req_id, res))[0].decode()
            r.verdicts[msg.req_id] = answer
            if not answer.startswith("OK:"):
                r.nacks.append(msg.req_id)
            if isinstance(res, Release):
                self._emit(
                    r.name, "transfer_done", f"{head}: {self.G} answers {answer}", verdict=answer
                )
                self._release(r, res)
            elif isinstance(res, LateTransfer):
                self._emit(
                    r.name,
                    "late_transfer",
                    f"{head}: LATE, lease {res.ended.value} at {fmt(res.ended_at)}: "
                    f"the reader may have read reused blocks; {self.G} answers {answer}",
                    id=res.req_id,
                    ended=res.ended.value,
                    nack=answer,
                    verdict=answer,
                )
            else:
                if isinstance(res, TransferCounted):
                    what = f"counted {res.done} of {res.readers}"
                else:
                    what = "early: not granted yet, staged"
                self._emit(
                    r.name,
                    "transfer_done",
                    f"{head}: {what}; {self.G} answers {answer}",
                    id=msg.req_id,
                    verdict=answer,
                )
        elif isinstance(msg, wire.Abort):
            rel = tab.abort(msg.req_id, now=now)
            if rel is not None:
                self._emit(r.name, "abort", head)
                self._release(r, rel)
            else:
                ended = tab.ended(msg.req_id)
                what = (
                    f"late (lease already {ended.value}), ignored"
                    if ended is not None
                    else "early: not granted yet, staged"
                )
                self._emit(r.name, "abort", f"{head}: {what}", id=msg.req_id)
        else:
            self._emit(
                r.name,
                "unexpected",
                f"{head}: a nack is {self.G}'s message, never {self.R}'s; dropped",
            )

    # -- D --------------------------------------------------------------------------------
    def _op_track(self, op: Op) -> None:
        a = op.args
        eng = a["engine"]
        self._d().track(
            a["id"], engine_id=eng, remote_req_id=a.get("remote_id"), now=self._now(self.R)
        )
        rid = a.get("remote_id", a["id"])
        self._emit(self.R, "track", f"track {a['id']} ({self.G}'s id {rid}) on {eng}", id=a["id"])
        if eng not in self.connected and eng not in self.handshake_done:
            k = self.engines[eng].handshake
            if k == 0:
                self.connected.add(eng)
            else:
                self.handshake_done[eng] = self.t + k
                self._emit(
                    self.R,
                    "handshake",
                    f"handshake with {eng} started, done at {fmt(self.t + k)}",
                    engine=eng,
                )

    def _op_untrack(self, op: Op) -> None:
        d = self._d()
        rid = op.args["id"]
        known = rid in d
        d.untrack(rid)
        self._emit(
            self.R, "untrack", f"untrack {rid}" + ("" if known else ": not tracked, no-op"), id=rid
        )

    def _op_d_step(self, op: Op) -> None:
        if self.tracker is None and "every" in op.args:
            return  # a periodic d_step ends when D crashes
        d = self._d()
        for eng, at in list(self.handshake_done.items()):
            if at <= self.t + TOL:
                del self.handshake_done[eng]
                self.connected.add(eng)
        pending = set(self.handshake_done)
        deferred = d.stats.deferred
        due = d.due(now=self._now(self.R), pending=pending)
        if d.stats.deferred > deferred:
            late = sorted(e for e in pending if e in d.engines())
            self._emit(
                self.R,
                "deferred",
                f"heartbeat to {', '.join(late)} deferred: handshake "
                "pending (the engine keeps its turn)",
            )
        for eng, ids in due.items():
            for payload in wire.encode_heartbeat(ids, max_bytes=self.cfg.max_notification_bytes):
                self._send(op, eng, None, payload, "heartbeat")

    def _send(self, op: Op, eng: str, rank: int | None, payload: bytes, kind: str) -> None:
        delay = op.args.get("delay", self.h.delay)
        ranks = self._select(eng, rank)
        dest = eng if rank is None else ranks[0].name
        if op.args.get("deliver", True):
            self._push(self.t + delay, 0, 0, (ranks, payload, self.t, op.line))
            fate = f"arrives {fmt(self.t + delay)}"
        else:
            fate = "LOST"
        self._emit(
            self.R,
            kind,
            f"send {show(payload)} to {dest}: {fate}",
            engine=eng,
            payload=payload.decode("utf-8", "backslashreplace"),
            lost=not op.args.get("deliver", True),
        )

    def _op_send(self, op: Op) -> None:
        self._d()
        a = op.args
        if "transfer_done" in a:  # sent once the READ has completed
            payload = wire.encode_transfer_done(a["transfer_done"], a.get("n", 1))
            self.read_done[a["transfer_done"]] = self.t
        elif "abort" in a:
            payload = wire.encode_abort(a["abort"])
        else:
            payload = a["msg"].encode("utf-8")
        self._send(op, a["engine"], a.get("rank"), payload, "send")

    def _op_drop_engine(self, op: Op) -> None:
        eng = op.args["engine"]
        lost = self._d().drop_engine(eng)
        self.connected.discard(eng)
        self.handshake_done.pop(eng, None)
        self._emit(
            self.R, "drop_engine", f"drop engine {eng}: fail over [{', '.join(lost)}]", ids=lost
        )

    def _op_d_crash(self, op: Op) -> None:
        n = len(self._d())
        self.tracker = None
        self.crashed_at = op.line
        self.connected.clear()
        self.handshake_done.clear()
        self._emit(
            self.R,
            "crash",
            f"{self.R} crashes: {n} tracked request(s) lost, no more heartbeats "
            "(messages already sent still arrive)",
        )

    def _op_d_restart(self, op: Op) -> None:
        if self.tracker is not None:
            raise ScenarioError(op.line, f"{self.written('d_restart')}: {self.R} is running")
        self.tracker = HeartbeatTracker(self.cfg)
        self._emit(self.R, "restart", f"{self.R} restarts with nothing tracked")

    # -- narration and checks ---------------------------------------------------------------
    def _op_note(self, op: Op) -> None:
        self._emit("-", "note", f"# {op.args['text']}")

    def _op_expect(self, op: Op) -> None:
        failures = check(self, op)
        checked = ", ".join(self.written(k) for k in op.args if k != "where")
        if failures:
            self.result.expects_failed += 1
            for f in failures:
                self._emit("-", "expect", f"EXPECT FAILED ({checked}): {f}", ok=False)
        else:
            self.result.expects_ok += 1
            self._emit("-", "expect", f"expect ok: {checked}", ok=True)


def _ignored(before: TableStats, after: TableStats) -> str:
    if after.renew_unknown > before.renew_unknown:
        return "unknown, ignored"
    if after.renew_late > before.renew_late:
        return "late (lease ended), ignored"
    return "lapsed (deadline passed, not yet reaped), ignored"


def replay(scenario: Scenario) -> ReplayResult:
    """Run a parsed scenario against the reference implementation."""
    return _Replay(scenario).run()


def replay_text(text: str) -> ReplayResult:
    """Parse and run a scenario.

    Raises:
        ScenarioError: a line that does not parse or validate (nothing ran).
    """
    return replay(parse_scenario(text))
