"""A prefill rank's lease step: what comes in from D over NIXL, what P frees,
and the verdicts it sends back (verified reads, I13).

Every notification goes through the gate (size cap, known senders), the
inbox (round-robin per sender, each handled at its poll instant) and
``wire.decode`` (malformed: counted and dropped) to ``renew`` /
``transfer_done`` / ``abort``; then ``expire``. Blocks are freed exactly when
the core returns a :class:`~leaseproto.Release`.

A reader that said it understands verdicts (a heartbeat naming the
capability token ``leaseproto/1``, acknowledged with ``OK:leaseproto/1``)
gets an answer to **every** transfer-done P handles: ``OK`` when the lease
was live then (the count completed it, or counted a partial read), ``NK``
with how it had ended otherwise (:func:`leaseproto.wire.verdict`, one rule).
A heartbeat naming a lease P no longer holds is answered ``LL`` (advisory).
A reader that never said so (a stock vLLM decoder) receives none of these.

Under ``policy="fixed"`` (a naive deployment, for comparison) heartbeats are
ignored, no capability is advertised and late transfers are only counted and
logged, as upstream does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core import wire
from ..core.events import LateTransfer, Release, ReleaseReason, TransferCounted
from ..core.table import LeaseTable
from .metrics import PrefillMetrics
from .notifications import DropLog, Inbox, NotificationGate
from .trace import text

if TYPE_CHECKING:
    from .backend import KVBackend
    from .loop import RankOptions

__all__ = ["PrefillLeases"]

log = logging.getLogger("leaseproto.prefill")

#: Longest one loop turn spends handling queued notifications, seconds.
_INBOX_BUDGET_S = 0.02
#: The capability token as it appears in a hello heartbeat's payload.
_HELLO = wire.CAPABILITY.encode()


class PrefillLeases:
    """The lease step of the prefill worker (which supplies the state below)."""

    opts: RankOptions
    table: LeaseTable
    backend: KVBackend
    metrics: PrefillMetrics
    blocks: dict[str, list[int]]
    gate: NotificationGate
    inbox: Inbox
    drops: DropLog
    #: readers that said they understand verdicts (agent names)
    verdict_readers: set[str]
    verdicts_sent: dict[str, int]
    last_release_at: float | None
    nacks_sent: int
    heartbeats_received: int
    malformed: int
    _now: float

    def _clock(self) -> float:
        raise NotImplementedError

    # -- releases -------------------------------------------------------------------------
    def _release(self, rel: Release) -> None:
        """Free the blocks of a lease the core just ended (spec: exactly then)."""
        blocks = self.blocks.pop(rel.req_id, [])
        self.backend.free(blocks)
        self.backend.trace.release(rel, len(blocks))
        self.last_release_at = rel.at
        self.metrics.observe_release(rel)
        if rel.reason is ReleaseReason.EXPIRED:
            if rel.last_renewal is None:
                why = (
                    f"lease expired {rel.at - rel.granted_at:.1f} s after the grant, never renewed"
                )
            else:
                why = f"lease expired {rel.at - rel.last_renewal:.1f} s after its last heartbeat"
            log.info("released %d blocks of req %s: %s", len(blocks), rel.req_id, why)
        elif rel.reason is ReleaseReason.ABORTED:
            log.info("released %d blocks of req %s: aborted by the reader", len(blocks), rel.req_id)
        else:
            log.info(
                "released %d blocks of req %s: transferred %.2f s after the grant",
                len(blocks),
                rel.req_id,
                rel.at - rel.granted_at,
            )

    # -- answers to D ---------------------------------------------------------------------
    def _send(self, sender: str, payload: bytes, kind: str) -> None:
        if self.backend.send(sender, payload):
            self.verdicts_sent[kind] += 1
            if kind in ("nk", "ll"):
                self.nacks_sent += 1
                self.metrics.nacks.inc()

    def _transfer_done(self, sender: str, msg: wire.TransferDone, now: float) -> None:
        out = self.table.transfer_done(msg.req_id, now=now, readers=msg.count)
        if isinstance(out, Release):
            self._release(out)
        elif isinstance(out, LateTransfer):
            log.warning(
                "late transfer-done for req %s from %s: its lease %s %.2f s earlier; %s",
                out.req_id,
                sender,
                out.ended.value,
                out.at - out.ended_at,
                "answering NK: the reader discards what it read"
                if sender in self.verdict_readers
                else "the reader may have read reused blocks (it takes no verdicts)",
            )
        elif isinstance(out, TransferCounted):
            log.debug("req %s: transfer-done %d of %d", out.req_id, out.done, out.readers)
        if sender in self.verdict_readers:
            verdict = wire.verdict(msg.req_id, out)
            if isinstance(verdict, wire.Ok):
                self._send(sender, wire.encode_ok(msg.req_id), "ok")
            else:
                self._send(sender, wire.encode_nack(msg.req_id, verdict.reason), "nk")

    def _heartbeat(self, sender: str, msg: wire.Heartbeat, now: float) -> None:
        self.heartbeats_received += 1
        self.metrics.heartbeats.inc()
        self.metrics.heartbeat_ids.inc(len(msg.ids))
        ids = msg.ids
        if wire.CAPABILITY in ids and self.opts.policy == "lease":  # the reader's hello
            ids = tuple(i for i in ids if i != wire.CAPABILITY)
            if sender not in self.verdict_readers:
                log.info("reader %s understands %s: it gets verdicts", sender, wire.CAPABILITY)
            self.verdict_readers.add(sender)
            self._send(sender, wire.encode_ok(wire.CAPABILITY), "hello")
        if self.opts.policy != "lease" or not ids:
            return
        lost: list[str] = []
        self.table.renew(ids, now=now, lost=lost)
        self._renewed(sender, ids, lost, now)

    def _fused_heartbeat(self, sender: str, payload: bytes, now: float) -> bool:
        """A heartbeat decoded and renewed in one pass (``LeaseTable.renew_heartbeat``:
        the same decisions as ``wire.decode`` then ``renew``, at a fraction of the
        cost); False when that path does not take it (``_notification`` then
        decodes it, which words any error). A payload naming the capability token
        (the reader's hello) goes the long way, which handles the hello."""
        if self.opts.policy != "lease" or type(payload) is not bytes or _HELLO in payload:
            return False
        lost: list[str] = []
        ids = self.table.renew_heartbeat(payload, now=now, lost=lost)
        if ids is None:
            return False
        self.heartbeats_received += 1
        self.metrics.heartbeats.inc()
        self.metrics.heartbeat_ids.inc(len(ids))
        self._renewed(sender, ids, lost, now)
        return True

    def _renewed(self, sender: str, ids: Sequence[str], lost: list[str], now: float) -> None:
        if self.backend.trace.enabled:
            deadlines = {rid: self.table.deadline(rid) for rid in ids}
            self.backend.trace.emit(
                "renew", now=now, leases={r: d - now for r, d in deadlines.items() if d is not None}
            )
        if log.isEnabledFor(logging.DEBUG):
            self._log_renewals(ids, sender, now)
        if sender not in self.verdict_readers:
            return
        for rid in lost:  # advisory: D has not read these yet and may give up now
            reason = self.table.lost_reason(rid, now=now)
            log.warning(
                "heartbeat from %s names req %s whose lease is gone (%s): answering LL",
                sender,
                rid,
                "unknown" if reason is None else reason.value,
            )
            ll = wire.lease_lost(rid, reason)
            self._send(sender, wire.encode_lease_lost(rid, ll.reason), "ll")

    def _log_renewals(self, ids: Sequence[str], sender: str, now: float) -> None:
        """One DEBUG line per id a heartbeat named: renewed until when, or why not."""
        for rid in ids:
            deadline = self.table.deadline(rid)
            if deadline is not None:
                log.debug(
                    "renewed req %s: lease ends in %.2f s (heartbeat from %s)",
                    rid,
                    deadline - now,
                    sender,
                )
            else:
                ended = self.table.ended(rid)
                log.debug(
                    "heartbeat from %s names req %s: not renewed (%s)",
                    sender,
                    rid,
                    "no lease known" if ended is None else f"lease already {ended.value}",
                )

    def _notification(self, sender: str, payload: bytes, now: float) -> None:
        if self.backend.trace.enabled:
            self.backend.trace.emit("handle", now=now, src=sender, data=text(payload))
        if self._fused_heartbeat(sender, payload, now):
            return
        try:
            msg = wire.decode(payload)
        except wire.MalformedMessage as exc:
            self._drop_malformed(f"from {sender}: {exc}")
            return
        if isinstance(msg, wire.Heartbeat):
            self._heartbeat(sender, msg, now)
        elif isinstance(msg, wire.TransferDone):
            self._transfer_done(sender, msg, now)
        elif isinstance(msg, wire.Abort):
            rel = self.table.abort(msg.req_id, now=now)
            if rel is not None:
                self._release(rel)
        else:  # OK, NK, LL are P -> D only
            self._drop_malformed(f"a {type(msg).__name__} from {sender}: P never receives it")

    def _drop_malformed(self, why: str) -> None:
        self.malformed += 1
        self.metrics.malformed.inc()
        self.drops.drop("malformed notification", why)

    def lease_step(self) -> None:
        # Each notification is handled at the instant it was polled (P had
        # received it by then), senders served round-robin within a budget, and
        # nothing expires until every notification polled so far is handled:
        # a renewal that arrived in time always counts, whatever the burst.
        polled = self._clock()
        self.inbox.add(self.gate.admit(self.backend.poll()), polled=polled)
        for at, sender, payload in self.inbox.take(budget_s=_INBOX_BUDGET_S):
            self._now = max(self._now, at)
            self._notification(sender, payload, self._now)
        if not self.inbox:
            now = max(polled, self._now)
            released = self.table.expire(now=now)
            self.backend.trace.expire(now, len(released))
            for rel in released:
                self._release(rel)
        self.drops.flush()
        for peer, reason in self.backend.take_lost_peers():
            log.info("NIXL peer %s lost (%s)", peer, reason)
        self.metrics.blocks_held.set(sum(len(b) for b in self.blocks.values()))
        self.metrics.blocks_free.set(self.backend.num_free)
