"""One prefill rank's trace replayed against the spec (trace validation, §9.1).

Two checks run side by side over the rank's events, in the rank's own order
(its clock):

* **the rules**: a ghost of every lease (state, deadline, grant instant)
  follows the logged grants and renewals; each logged release, renewal and
  verdict must be a transition :data:`~leaseproto.core.state.TRANSITIONS` has
  for the input that caused it, with its guard holding by
  :mod:`leaseproto.core.rules` (an EXPIRED release needs ``expire_due``, a
  renewal ``renew_applies`` and ``renew_rule``'s bound, an OK
  ``transfer_verdict_ok``);
* **the oracle**: every input the worker logged (grants, request-plane aborts,
  each notification it handed over with its ``now``, each ``expire``) goes
  through the spec's naive model of a rank (:class:`~.naive.NaiveLeaseTable`,
  written from the spec's prose, not the worker's :class:`~leaseproto.LeaseTable`:
  a table bug is not in both the worker and its validator) built from the
  configuration in the trace's header, and what the worker logged between one
  input and the next (releases, renewals, notifications sent) must be exactly
  what the model and the verdict rule (:func:`leaseproto.wire.verdict`) produce
  for it -- staging, tombstones and re-grants included.

Beside them: P's ``now`` never goes back (§10: the table would refuse it), and
**A1**: P reaps only once it has handled what it had received -- a
notification a poll returned before an ``expire`` and handled after it broke
A1 (a sender P has not handled anything from yet may be held by the sender
gate until its metadata arrives, and is excused; so is one P forgot, a
``forget`` event, until P handles something from it again: its metadata is
gone and its next notifications wait in the gate as a stranger's do, §10.2).
A malformed event is a
violation naming its line, not an error.

A ``handle`` event's ``refused`` ids are acts the worker ignored because
the lease is bound to other agents (§10.2, leases bound to their reader):
the table is handed the notification without them. Its ``ids`` (a heartbeat)
are the lease ids its ids named where that is not the ids themselves (push
mode: P maps D's id or the router's to its lease by base id, §11.2), and its
``readers`` (a transfer-done) the count the table is handed where it is not the
message's ``n`` (push mode: vLLM's WRITE completion carries P's TP size, D
counts the P ranks that write to it, §2.8). A ``written`` event (``req``,
``now``) is P's own WRITE of a lease's blocks completing (push mode): the
lease ends TRANSFERRED as by its one reader's transfer-done.

A trace cut short (no ``end``: the worker was killed) may lack the outputs of
its last input; nothing else is excused.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Any

from ..core import rules, wire
from ..core.config import LeaseConfig
from ..core.events import LateTransfer, Release, ReleaseReason, TransferCounted
from ..core.state import TRANSITIONS, Input, LeaseState
from .naive import NaiveLeaseTable
from .trace_events import HELLO, Event, Violation, _reader_sends, _reader_side, _release_of

__all__ = ["PrefillReplay"]

#: Slack for a deadline rebuilt from a logged duration (``(d - now) + now``).
EPS = 1e-6

_STATE_OF = {
    ReleaseReason.TRANSFERRED: LeaseState.TRANSFERRED,
    ReleaseReason.EXPIRED: LeaseState.EXPIRED,
    ReleaseReason.ABORTED: LeaseState.ABORTED,
}


@dataclass
class _Ghost:
    state: int
    deadline: float
    granted_at: float


class PrefillReplay:
    """Replays one prefill rank's trace; :attr:`violations` holds what fails."""

    def __init__(self, header: dict[str, Any], *, complete: bool) -> None:
        self.config = LeaseConfig.from_extra_config(header.get("config", {}))
        push = header.get("config", {}).get("push_registration_timeout")
        self.push_ttl: float | None = None if push is None else float(push)
        self.table = NaiveLeaseTable(self.config)
        self.lease_policy = header.get("policy", "lease") == "lease"
        self.complete = complete
        self.readers: set[str] = set()
        self.ghost: dict[str, _Ghost] = {}
        self.received: Counter[tuple[str, bytes]] = Counter()
        #: (sender, bytes) -> the recv events not handled yet, oldest first (A1)
        self.unhandled: defaultdict[tuple[str, bytes], deque[Event]] = defaultdict(deque)
        #: recv events an expire reaped over while they were unhandled -> that expire
        self.reaped_over: dict[int, Event] = {}
        #: senders P handled a notification from (known to its sender gate)
        self.known: set[str] = set()
        self._now = -float("inf")
        self.violations: list[Violation] = []
        self.grants = 0
        self.releases = 0
        self._cause: Event | None = None
        self._msg: wire.Message | None = None
        self._verdict_state = rules.ABSENT
        self._expected: list[tuple[Any, ...]] = []
        #: (reader agent, request id) -> the lease's state when P first handled that
        #: reader's transfer-done (I13: what a read of it is worth)
        self.read_state: dict[tuple[str, str], int] = {}

    def _fail(self, inv: str, event: Event, message: str) -> None:
        self.violations.append(Violation(inv, event, message))

    # -- inputs ---------------------------------------------------------------------------
    def feed(self, e: Event) -> None:
        """One event; a malformed one (a field missing or of the wrong type) is a
        violation naming its line."""
        try:
            self._feed(e)
        except (KeyError, TypeError, ValueError) as exc:
            self._fail("format", e, f"a malformed {e.ev!r} event: {exc!r}")

    def _feed(self, e: Event) -> None:
        kind, o = e.ev, e.obj
        if kind in ("recv", "handle") and _reader_side(e.data()):
            return  # a verdict for this process's reads: its reader side's (spec §2.8)
        if kind == "recv":
            key = (str(o["src"]), e.data())
            self.received[key] += 1
            self.unhandled[key].append(e)
        elif kind in ("grant", "abort_req", "handle", "expire", "written"):
            self._close()
            self._cause = e
            self._msg = None
            now = float(o["now"])
            if now < self._now:
                self._fail("§10", e, f"P's now went back from {self._now} to {now}")
            self._now = max(self._now, now)
            getattr(self, "_in_" + kind)(e, o)
        elif kind == "release":
            self._out_release(e, o)
        elif kind == "renew":
            self._out_renew(e, o)
        elif kind == "send":
            self._out_send(e, o)
        elif kind == "forget":
            # P removed these agents' metadata: what they send next may be held
            # by the sender gate until they push it again (A1 excuses it)
            self.known.difference_update(str(a) for a in o["agents"])

    def finish(self) -> None:
        if self.complete:
            self._close()

    def _close(self) -> None:
        """What the table produced for the last input and the worker never logged."""
        for item in self._expected:
            cause = self._cause
            assert cause is not None
            if item[0] == "release":
                rel: Release = item[1]
                inv = {"expired": "I4", "transferred": "I10"}.get(rel.reason.value, "I3")
                self._fail(
                    inv, cause, f"the worker never released {rel.req_id} ({rel.reason.value})"
                )
            elif item[0] == "renew":
                self._fail("I6", cause, f"the heartbeat's renewals were never logged: {item[1]}")
            else:
                self._fail("I13", cause, f"never sent {item[2]!r} to {item[1]}")
        self._expected = []

    def _in_grant(self, e: Event, o: dict[str, Any]) -> None:
        now, req = float(o["now"]), str(o["req"])
        self.grants += 1
        g = self.ghost.get(req)
        if (g is not None and g.state == rules.GRANTED) or req in self.table:
            self._fail("I3", e, f"{req} granted again while its lease is live")
            return
        consumers = int(o.get("consumers", 1))
        if not 1 <= consumers <= wire.MAX_COUNT:
            self._fail("format", e, f"a grant to {consumers} consumers")
            return
        initial = self._initial_ttl(e, o)
        if initial is None:
            return
        ttl = rules.grant_deadline(now, initial) - now
        rest: float | None = initial
        if o.get("rebased"):  # vLLM: the scheduler stamped the lease earlier; its rest is granted
            rest = float(o["lease"]) if o.get("lease") is not None else None
            if rest is not None and not 0.0 < rest <= ttl + EPS:
                self._fail("I5", e, f"a rebased grant of {rest} s, not within the initial {ttl} s")
        rel = self.table.grant(req, now=now, consumers=consumers, ttl=rest)
        deadline = self.table.deadline(req)
        lease = None if deadline is None else deadline - now
        logged = o.get("lease")
        if lease != logged and not (
            o.get("rebased") and rest is not None and lease is not None and abs(lease - rest) <= EPS
        ):
            self._fail("I5", e, f"logged lease {logged}, the table grants {lease}")
        if lease is not None and not o.get("rebased") and abs(lease - ttl) > EPS:
            self._fail("I5", e, f"a {lease} s lease, not the initial {ttl} s")
        self.ghost[req] = _Ghost(rules.GRANTED, now + float(o.get("lease") or 0.0), now)
        if rel is not None:
            self._expected.append(("release", rel))

    def _initial_ttl(self, e: Event, o: dict[str, Any]) -> float | None:
        """The initial lease of a grant of this kind (spec §2.8): P's lease
        (``prefill``, the default), D's cached turn (``turn``) or D's push
        registration (``push``, ``push_registration_timeout`` in the header's
        configuration, ``decoder_kv_blocks_ttl`` when absent); None (a format
        violation) for another kind."""
        kind = o.get("kind", "prefill")
        if kind == "prefill":
            return self.config.kv_lease_duration
        if kind == "turn":
            return self.config.decoder_kv_blocks_ttl
        if kind == "push":
            push = self.push_ttl
            return self.config.decoder_kv_blocks_ttl if push is None else push
        self._fail("format", e, f"a grant of kind {kind!r} (not prefill, turn or push)")
        return None

    def _in_written(self, e: Event, o: dict[str, Any]) -> None:
        rel = self.table.transfer_done(str(o["req"]), now=float(o["now"]), readers=1)
        if isinstance(rel, Release):
            self._expected.append(("release", rel))

    def _in_abort_req(self, e: Event, o: dict[str, Any]) -> None:
        rel = self.table.abort(str(o["req"]), now=float(o["now"]))
        if rel is not None:
            self._expected.append(("release", rel))

    def _in_expire(self, e: Event, o: dict[str, Any]) -> None:
        for (src, _), waiting in self.unhandled.items():
            for recv in waiting:
                if src in self.known:
                    self.reaped_over.setdefault(id(recv), e)
        out = self.table.expire(now=float(o["now"]))
        self._expected += [("release", rel) for rel in out]

    def _in_handle(self, e: Event, o: dict[str, Any]) -> None:
        now, src, data = float(o["now"]), str(o["src"]), e.data()
        if self.received[(src, data)] <= 0:
            self._fail("§3.1", e, f"handled a notification from {src} that no poll returned")
        else:
            self.received[(src, data)] -= 1
            recv = self.unhandled[(src, data)].popleft()
            reap = self.reaped_over.pop(id(recv), None)
            if reap is not None:
                self._fail(
                    "A1",
                    reap,
                    f"expire at {reap.obj.get('now')} while a notification from {src} "
                    f"received at {recv.path}:{recv.line} was not handled (handled at line "
                    f"{e.line})",
                )
        self.known.add(src)
        if data.startswith(HELLO) and self.lease_policy:  # the vLLM connector's greeting
            self.readers.add(src)
            return
        try:
            msg = self._msg = wire.decode(data)
        except wire.MalformedMessage:
            return
        refused = frozenset(str(i) for i in o.get("refused", ()))
        if isinstance(msg, wire.Heartbeat) and "ids" in o:
            msg = self._msg = wire.Heartbeat(tuple(str(i) for i in o["ids"]))
        elif isinstance(msg, wire.TransferDone) and "readers" in o:
            msg = self._msg = wire.TransferDone(msg.req_id, int(o["readers"]))
        if isinstance(msg, wire.Heartbeat):
            if refused:
                msg = wire.Heartbeat(tuple(i for i in msg.ids if i not in refused))
            self._heartbeat(src, msg, now)
        elif isinstance(msg, (wire.TransferDone, wire.Abort)) and msg.req_id in refused:
            return  # bound to other agents: the worker ignored it
        elif isinstance(msg, wire.TransferDone):
            g = self.ghost.get(msg.req_id)
            self._verdict_state = rules.ABSENT if g is None else g.state
            self.read_state.setdefault((src, msg.req_id), self._verdict_state)
            out = self.table.transfer_done(msg.req_id, now=now, readers=msg.count)
            if isinstance(out, Release):
                self._expected.append(("release", out))
            if src in self.readers:
                verdict = wire.verdict(msg.req_id, out)
                payload = (
                    wire.encode_ok(msg.req_id)
                    if isinstance(verdict, wire.Ok)
                    else wire.encode_nack(msg.req_id, verdict.reason)
                )
                self._expected.append(("send", src, payload))
            assert out is None or isinstance(out, (Release, LateTransfer, TransferCounted))
        elif isinstance(msg, wire.Abort):
            rel = self.table.abort(msg.req_id, now=now)
            if rel is not None:
                self._expected.append(("release", rel))

    def _heartbeat(self, src: str, msg: wire.Heartbeat, now: float) -> None:
        ids = msg.ids
        if wire.CAPABILITY in ids and self.lease_policy:
            ids = tuple(i for i in ids if i != wire.CAPABILITY)
            self.readers.add(src)
            self._expected.append(("send", src, wire.encode_ok(wire.CAPABILITY)))
        if not self.lease_policy or not ids:
            return
        lost: list[str] = []
        self.table.renew(ids, now=now, lost=lost)
        left = {rid: self.table.deadline(rid) for rid in ids}
        self._expected.append(("renew", {r: d - now for r, d in left.items() if d is not None}))
        if src in self.readers:
            for rid in lost:
                ll = wire.lease_lost(rid, self.table.lost_reason(rid, now=now))
                self._expected.append(("send", src, wire.encode_lease_lost(rid, ll.reason)))

    # -- outputs --------------------------------------------------------------------------
    def _match(self, item: tuple[Any, ...]) -> bool:
        if item in self._expected:
            self._expected.remove(item)
            return True
        return False

    def _input(self) -> Input | None:
        cause, msg = self._cause, self._msg
        if cause is None:
            return None
        if cause.ev == "expire":
            return Input.TIMER_EXPIRE
        if cause.ev == "abort_req" or isinstance(msg, wire.Abort):
            return Input.RECV_ABORT
        if cause.ev == "grant":
            return Input.GRANT
        if cause.ev == "written" or isinstance(msg, wire.TransferDone):
            return Input.RECV_TRANSFER_DONE
        if isinstance(msg, wire.Heartbeat):
            return Input.RECV_HEARTBEAT
        return None

    def _names(self, req: str) -> bool:
        """Whether the input being handled names ``req``."""
        cause, msg = self._cause, self._msg
        if cause is None:
            return False
        if cause.ev in ("grant", "abort_req", "written"):
            return str(cause.obj.get("req")) == req
        if isinstance(msg, wire.Heartbeat):
            return req in msg.ids
        return isinstance(msg, (wire.TransferDone, wire.Abort)) and msg.req_id == req

    def _out_release(self, e: Event, o: dict[str, Any]) -> None:
        self.releases += 1
        rel = _release_of(o)
        g = self.ghost.get(rel.req_id)
        inp = self._input()
        if g is None or g.state != rules.GRANTED:
            self._fail("I3", e, f"{rel.req_id} released while not live (twice, or never granted)")
        elif rel.reason is ReleaseReason.EXPIRED and not rules.expire_due(
            g.state, g.deadline - EPS, rel.at
        ):
            self._fail(
                "I12", e, f"{rel.req_id} expired at {rel.at}, before its deadline {g.deadline}"
            )
        elif inp is None or (inp is not Input.TIMER_EXPIRE and not self._names(rel.req_id)):
            self._fail("I3", e, f"no input explains the release of {rel.req_id}")
        else:
            row = TRANSITIONS.get((LeaseState(g.state), inp))
            target = _STATE_OF[rel.reason]
            if row is None or row.target is not target:
                inv = "I10" if rel.reason is ReleaseReason.TRANSFERRED else "I3"
                self._fail(inv, e, f"no transition GRANTED --{inp.value}--> {target.name}")
            elif not self._match(("release", rel)):
                inv = {"expired": "I12", "transferred": "I10"}.get(rel.reason.value, "I3")
                self._fail(inv, e, f"the table does not release {rel.req_id} so here")
        if g is not None:
            g.state = int(_STATE_OF[rel.reason])

    def _out_renew(self, e: Event, o: dict[str, Any]) -> None:
        now = float(o["now"])
        leases = {str(k): float(v) for k, v in dict(o.get("leases", {})).items()}
        heartbeat = self._input() is Input.RECV_HEARTBEAT
        ext, cap = self.config.lease_extension, self.config.max_lease_lifetime
        for rid, left in leases.items():
            g, new = self.ghost.get(rid), now + left
            if not heartbeat or not self._names(rid):
                self._fail("I6", e, f"a renewal of {rid} that no received heartbeat explains")
            elif g is None or g.state != rules.GRANTED:
                self._fail("I2", e, f"{rid} renewed while not live")
            elif new < g.deadline - EPS:
                self._fail("I1", e, f"{rid}'s deadline shortened: {g.deadline} -> {new}")
            elif new > g.deadline + EPS:
                cap_at = None if cap is None else g.granted_at + cap
                applies, bound = rules.renew_rule(g.state, g.deadline, cap_at, now, ext)
                if not applies:
                    self._fail("I2", e, f"{rid} renewed after its deadline {g.deadline}")
                elif new > bound + EPS:
                    inv = "I7" if cap_at is not None and new > cap_at + EPS else "I6"
                    self._fail(inv, e, f"{rid} renewed to {new}, past the rule's {bound}")
                g.deadline = new
        if not self._match(("renew", leases)) and not any(v.event is e for v in self.violations):
            self._fail("I6", e, "renewals differ from what the table does for this heartbeat")

    def _out_send(self, e: Event, o: dict[str, Any]) -> None:
        to, data = str(o["to"]), e.data()
        if _reader_sends(data):  # this process reads too (the vLLM connector's D): not the table's
            return
        try:
            msg = wire.decode(data)
        except wire.MalformedMessage:
            msg = None
        if isinstance(msg, (wire.Heartbeat, wire.TransferDone, wire.Abort)):
            return  # what this process sends as a reader of another's lease (spec §2.8)
        done = self._msg if isinstance(self._msg, wire.TransferDone) else None
        if isinstance(msg, (wire.Ok, wire.Nack)) and done is not None and msg.req_id == done.req_id:
            ok = rules.transfer_verdict_ok(self._verdict_state)
            if isinstance(msg, wire.Ok) != bool(ok):
                state = LeaseState(self._verdict_state).name
                self._fail("I13", e, f"{type(msg).__name__} for {msg.req_id} handled in {state}")
                return
        if not self._match(("send", to, data)):
            self._fail("I13", e, f"sent {data!r} to {to}, which nothing P handled calls for")
