"""A grantor's leases (:class:`LeaseGrants`): what comes in from the readers
over NIXL, what the grantor frees, and the verdicts it sends back (verified
reads, I13). A part of the prefill worker (P's leases on prefilled prompts)
and of the decode worker (D's leases on cached turns,
:class:`~.decode_turns.TurnGrants`), owning its state: the core's
``LeaseTable``, the blocks each lease holds, the readers each is bound to
(:class:`~.prefill_binding.ReaderBinding`), the inbox, and which readers take
verdicts.

Every notification goes through the gate (size cap, known senders), the
inbox (round-robin per sender, each handled at its poll instant) and
``wire.decode`` (malformed: counted and dropped) to ``renew`` /
``transfer_done`` / ``abort``; then ``expire``. Blocks are freed exactly when
the core returns a :class:`~leaseproto.Release`.

A reader that said it understands verdicts (a heartbeat naming the
capability token ``leaseproto/1``, acknowledged with ``OK:leaseproto/1``)
gets an answer to **every** transfer-done the grantor handles: ``OK`` when
the lease was live then (the count completed it, or counted a partial read),
``NK`` with how it had ended otherwise (:func:`leaseproto.wire.verdict`, one
rule). A heartbeat naming a lease no longer held is answered ``LL``
(advisory). A reader that never said so (a stock vLLM decoder) receives none
of these.

Under ``policy="fixed"`` (a naive deployment, for comparison) heartbeats are
ignored, no capability is advertised and late transfers are only counted and
logged, as upstream does.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..core import wire
from ..core.events import LateTransfer, Release, ReleaseReason, TransferCounted
from ..core.table import LeaseTable
from . import verdicts
from .metrics import PrefillMetrics
from .notifications import DropLog, Inbox, NotificationGate
from .prefill_binding import ReaderBinding
from .trace import text

if TYPE_CHECKING:
    from .backend import KVBackend
    from .loop import RankOptions

__all__ = ["LeaseGrants"]

log = logging.getLogger("leaseproto.prefill")

#: Longest one loop turn spends handling queued notifications, seconds.
_INBOX_BUDGET_S = 0.02
#: The capability token as it appears in a hello heartbeat's payload.
_HELLO = wire.CAPABILITY.encode()
#: Seconds between two looks for silent decoders to forget.
_PRUNE_EVERY_S = 1.0
#: Most forgotten verdict readers remembered, so one that comes back gets verdicts again.
_FORGOTTEN_READERS = 4096


class LeaseGrants:
    """The leases a grantor holds for its readers, and its lease step."""

    def __init__(
        self,
        opts: RankOptions,
        table: LeaseTable,
        backend: KVBackend,
        metrics: PrefillMetrics,
        gate: NotificationGate,
        *,
        drops: DropLog,
        notes: DropLog,
        reader: Callable[[str, wire.Message], bool] | None = None,
        forget_silent: bool = True,
        in_use: Callable[[], Collection[str]] | None = None,
        sent: Callable[[str], None] | None = None,
        released: Callable[[Release], None] | None = None,
    ) -> None:
        """``table``: a new one (the metrics read it); ``drops``, ``notes``: the
        rate-limited logs of what was refused and of the other lines a peer can
        trigger; ``reader``: takes the verdicts and ``LL`` of a grantor that
        also reads others' leases (P reading D's cached turns), True when it
        did; ``forget_silent``: forget readers gone silent (off where the NIXL
        endpoint also serves the worker's own reads); ``in_use``: the agents
        the worker's own reads use now, never forgotten (a D silent toward P's
        leases may be one whose cached turn P reads); ``sent``, ``released``:
        told of each answer sent (its kind) and each release, after the fact."""
        self.opts = opts
        self.table = table
        self.backend = backend
        self.metrics = metrics
        self.gate = gate
        self.drops = drops
        self.notes = notes
        self._reader = reader
        self._forgets = forget_silent
        self._in_use = in_use
        self._sent = sent
        self._released = released
        #: lease id -> the blocks held under it
        self.blocks: dict[str, list[int]] = {}
        self.inbox = Inbox()
        #: which D agents may act for each live lease (spec §10.2)
        self.binding = ReaderBinding(ended_capacity=opts.config.tombstone_capacity)
        #: readers that said they understand verdicts (agent names)
        self.verdict_readers: set[str] = set()
        #: verdict readers forgotten (oldest first), restored when heard again
        self.forgotten_readers: OrderedDict[str, None] = OrderedDict()
        self.agents_forgotten = 0
        self.verdicts_sent = dict.fromkeys(("ok", "nk", "ll", "hello"), 0)
        self.last_release_at: float | None = None
        self.nacks_sent = 0
        self.heartbeats_received = 0
        self.malformed = 0
        self._now = -math.inf
        self._pruned_at = -math.inf

    def clock(self) -> float:
        """The grantor's clock: monotonic, and never behind a notification
        already handled (each is handled at its poll instant)."""
        self._now = max(self._now, time.monotonic())
        return self._now

    # -- grants and releases --------------------------------------------------------------
    def grant(
        self,
        lease_id: str,
        blocks: list[int],
        *,
        now: float,
        consumers: int,
        readers: Sequence[str],
    ) -> Release | None:
        """Grant a lease on ``blocks`` to ``consumers`` readers, bound to the
        agents ``readers`` (none: the first to act binds it). A Release when
        the core ended it at once (a staged abort or transfer-done): the caller
        then hands it to :meth:`release`."""
        rel = self.table.grant(lease_id, now=now, consumers=consumers)
        self.blocks[lease_id] = blocks
        self.binding.name(lease_id, readers)
        return rel

    def release(self, rel: Release) -> None:
        """Free the blocks of a lease the core just ended (spec: exactly then)."""
        blocks = self.blocks.pop(rel.req_id, [])
        self.binding.release(rel.req_id)
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
        if self._released is not None:
            self._released(rel)

    # -- answers to D ---------------------------------------------------------------------
    def _send(self, sender: str, payload: bytes, kind: str) -> None:
        if self.backend.send(sender, payload):
            self.verdicts_sent[kind] += 1
            if kind in ("nk", "ll"):
                self.nacks_sent += 1
                self.metrics.nacks.inc()
            if self._sent is not None:
                self._sent(kind)

    def _refusals(self, sender: str, msg: wire.Message) -> list[str]:
        """The ids ``msg`` names whose lease is bound to agents other than
        ``sender`` (:class:`ReaderBinding`; unbound live ones are bound to the
        sender's engine); counted and logged (rate-limited). P ignores those
        acts and answers nothing for them."""
        live = self.blocks
        admits = self.binding.admits
        if isinstance(msg, wire.Heartbeat):
            if self.opts.policy != "lease":
                return []
            kind = "heartbeat"
            ids = [i for i in msg.ids if i != wire.CAPABILITY]
        elif isinstance(msg, (wire.TransferDone, wire.Abort)):
            kind = "abort" if isinstance(msg, wire.Abort) else "transfer_done"
            ids = [msg.req_id]
        else:
            return []
        refused = [i for i in ids if not admits(sender, i, live=i in live, kind=kind)]
        if refused:
            self._refused(sender, refused, kind)
        return refused

    def _refused(self, sender: str, ids: Sequence[str], kind: str) -> None:
        self.metrics.acts_refused.labels(kind=kind).inc(len(ids))
        group = self.binding.bound(ids[0]) or frozenset()
        self.drops.drop(
            "act for a lease bound to other agents",
            f"{kind} from {sender} for req {ids[0]}"
            f"{f' and {len(ids) - 1} more' if len(ids) > 1 else ''}, bound to "
            f"{', '.join(sorted(group))}",
        )

    def _transfer_done(self, sender: str, msg: wire.TransferDone, now: float) -> None:
        out, verdict = verdicts.transfer_done(self.table, msg, now=now)
        if isinstance(out, Release):
            self.release(out)
        elif isinstance(out, LateTransfer):
            self.notes.drop(
                "late transfer-done",
                f"req {out.req_id} from {sender}: its lease {out.ended.value} "
                f"{out.at - out.ended_at:.2f} s earlier; "
                + (
                    "answering NK: the reader discards what it read"
                    if sender in self.verdict_readers
                    else "the reader may have read reused blocks (it takes no verdicts)"
                ),
            )
        elif isinstance(out, TransferCounted):
            log.debug("req %s: transfer-done %d of %d", out.req_id, out.done, out.readers)
        if sender in self.verdict_readers:
            self._send(
                sender, verdicts.answer(verdict), "ok" if isinstance(verdict, wire.Ok) else "nk"
            )

    def _heartbeat(
        self, sender: str, msg: wire.Heartbeat, now: float, refused: Sequence[str]
    ) -> None:
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
        if refused:
            skip = set(refused)
            ids = tuple(i for i in ids if i not in skip)
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
        if not payload.startswith(wire.HEARTBEAT_PREFIX):
            return False
        binding = self.binding
        engine = binding.only_engine()
        unbound: list[str] | None = []
        every_live_lease_bound_to_sender = len(binding) == len(self.blocks) and (
            not self.blocks or (engine is not None and sender in engine)
        )
        if not every_live_lease_bound_to_sender:  # check id by id
            try:
                named = payload[3:].decode().split(",")
            except UnicodeDecodeError:
                return False
            unbound = binding.unbound_for(sender, named, self.blocks)
            if unbound is None:  # it names a lease bound to other agents: the slow path
                return False
        lost: list[str] = []
        ids = self.table.renew_heartbeat(payload, now=now, lost=lost)
        if ids is None:
            return False
        self._handled(sender, payload, now, ())  # before its outputs (renew, LL)
        if unbound:  # trust on first use: these leases are now bound to the sender's engine
            self.binding.bind(sender, unbound)
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
        for ll in verdicts.lease_lost_answers(self.table, lost, now=now):
            # advisory: D has not read these yet and may give up now
            self.notes.drop(
                "heartbeat naming a lease that is gone",
                f"from {sender}: req {ll.req_id} ({ll.reason}): answering LL",
            )
            self._send(sender, verdicts.answer(ll), "ll")

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

    def _handled(self, sender: str, payload: bytes, now: float, refused: Sequence[str]) -> None:
        """Trace the notification P handles now, with the ids it refused
        (check-trace hands the rest to its table)."""
        if self.backend.trace.enabled:
            extra: dict[str, Any] = {"refused": list(refused)} if refused else {}
            self.backend.trace.emit("handle", now=now, src=sender, data=text(payload), **extra)

    def _notification(self, sender: str, payload: bytes, now: float) -> None:
        self.binding.heard(sender, now)
        if self.forgotten_readers and sender in self.forgotten_readers:
            del self.forgotten_readers[sender]  # a reader P forgot is back (it pushed again)
            self.verdict_readers.add(sender)
        if self._fused_heartbeat(sender, payload, now):
            return
        try:
            msg = wire.decode(payload)
        except wire.MalformedMessage as exc:
            self._handled(sender, payload, now, ())
            self._drop_malformed(f"from {sender}: {exc}")
            return
        refused = self._refusals(sender, msg)
        self._handled(sender, payload, now, refused)
        if isinstance(msg, wire.Heartbeat):
            self._heartbeat(sender, msg, now, refused)
        elif refused:
            return  # a transfer-done or abort for a lease bound to other agents
        elif isinstance(msg, wire.TransferDone):
            self._transfer_done(sender, msg, now)
        elif isinstance(msg, wire.Abort):
            rel = self.table.abort(msg.req_id, now=now)
            if rel is not None:
                self.release(rel)
        else:  # OK, NK, LL: for the reader side of this process, if it has one
            self._reader_message(sender, msg)

    def _reader_message(self, sender: str, msg: wire.Message) -> None:
        """A verdict or ``LL`` (grantor -> reader): the ``reader`` takes it, if
        this worker also reads leases of others (P reading D's cached turns)."""
        if self._reader is None or not self._reader(sender, msg):
            self._drop_malformed(
                f"a {type(msg).__name__} from {sender}: a grantor never receives it"
            )

    def _drop_malformed(self, why: str) -> None:
        self.malformed += 1
        self.metrics.malformed.inc()
        self.drops.drop("malformed notification", why)

    def _forget_silent(self) -> None:
        """Forget decoders bound to no live lease and unheard for ``tombstone_ttl``
        (at least two lease extensions; checked once a second): their NIXL agent
        is removed and P's records of them dropped. A decoder of ours that comes
        back pushes its metadata again first (it does after two heartbeat
        intervals without traffic, which T2 keeps within two extensions), and a
        verdict reader among the last few thousand forgotten gets verdicts again."""
        if not self._forgets:
            return
        now = self.clock()
        if now - self._pruned_at < _PRUNE_EVERY_S:
            return
        self._pruned_at = now
        cfg = self.opts.config
        ttl = max(cfg.tombstone_ttl, 2.0 * cfg.lease_extension)
        keep = () if self._in_use is None else self._in_use()
        gone = self.binding.silent(now=now, ttl=ttl, keep=keep)
        if gone:
            self.backend.trace.emit("forget", now=now, agents=gone)
        for agent in gone:
            if agent in self.verdict_readers:
                self.verdict_readers.discard(agent)
                self.forgotten_readers[agent] = None
                if len(self.forgotten_readers) > _FORGOTTEN_READERS:
                    self.forgotten_readers.popitem(last=False)
            self.backend.forget(agent)
        if gone:  # one line a second at most, however many agents go
            self.agents_forgotten += len(gone)
            self.metrics.agents_forgotten.inc(len(gone))
            log.info(
                "forgot %d decoder agent%s (no live lease, silent for %g s): %s",
                len(gone),
                "" if len(gone) == 1 else "s",
                ttl,
                ", ".join(gone[:4]) + (" ..." if len(gone) > 4 else ""),
            )

    def lease_step(self) -> None:
        self.grant_step(self.gate.admit(self.backend.poll()))
        for peer, reason in self.backend.take_lost_peers():
            log.info("NIXL peer %s lost (%s)", peer, reason)

    def grant_step(self, got: Sequence[tuple[str, bytes]]) -> None:
        """Handle ``got`` (notifications for this grant table), then expire."""
        # Each notification is handled at the instant it was polled (P had
        # received it by then), senders served round-robin within a budget, and
        # nothing expires until every notification polled so far is handled:
        # a renewal that arrived in time always counts, whatever the burst.
        polled = self.clock()
        self.inbox.add(list(got), polled=polled)
        for at, sender, payload in self.inbox.take(budget_s=_INBOX_BUDGET_S):
            self._now = max(self._now, at)
            self._notification(sender, payload, self._now)
        if not self.inbox:
            now = max(polled, self._now)
            released = self.table.expire(now=now)
            self.backend.trace.expire(now, len(released))
            for rel in released:
                self.release(rel)
        self.drops.flush()
        # (lost peers are the lease step's: on D they are the reader side's)
        self._forget_silent()
        self.metrics.blocks_held.set(sum(len(b) for b in self.blocks.values()))
        self.metrics.blocks_free.set(self.backend.num_free)
