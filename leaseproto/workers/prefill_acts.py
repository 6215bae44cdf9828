"""What the readers of a grantor's leases say over NIXL, and what the grantor
answers them (:class:`ReaderActs`, verified reads, I13): a part of
:class:`~.prefill_leases.LeaseGrants`, owning the readers that take verdicts
(and those forgotten, restored when heard again), the answers sent and the
heartbeats and malformed notifications counted. It acts on the grants'
``LeaseTable``, the blocks each lease holds and the readers each is bound to
(:class:`~.prefill_binding.ReaderBinding`), and hands every Release the core
returns to the grants, which free its blocks.

One notification (:meth:`ReaderActs.handle`, at its poll instant): a plain
heartbeat is decoded and renewed in one pass (``LeaseTable.renew_heartbeat``);
anything else goes through ``wire.decode`` (malformed: counted and dropped),
the binding (acts for a lease bound to other agents: counted, logged and
ignored) and on to ``renew`` / ``transfer_done`` / ``abort``.

A reader that said it understands verdicts (a heartbeat naming the
capability token ``leaseproto/1``, acknowledged with ``OK:leaseproto/1``)
gets an answer to **every** transfer-done the grantor handles: ``OK`` when
the lease was live then (the count completed it, or counted a partial read),
``NK`` with how it had ended otherwise (:func:`leaseproto.wire.verdict`, one
rule). A heartbeat naming a lease no longer held is answered ``LL``
(advisory). A reader that never said so (a stock vLLM decoder) receives none
of these. A verdict or ``LL`` that comes in (grantor -> reader) goes to the
worker's reader side, if it has one.

Under ``policy="fixed"`` (a naive deployment, for comparison) heartbeats are
ignored, no capability is advertised and late transfers are only counted and
logged, as upstream does.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..core import wire
from ..core.events import LateTransfer, Release, TransferCounted
from ..core.table import LeaseTable
from . import verdicts
from .metrics import PrefillMetrics
from .notifications import DropLog
from .prefill_binding import ReaderBinding
from .trace import text

if TYPE_CHECKING:
    from .backend import KVBackend
    from .loop import RankOptions

__all__ = ["ReaderActs"]

log = logging.getLogger("leaseproto.prefill")

#: The capability token as it appears in a hello heartbeat's payload.
_HELLO = wire.CAPABILITY.encode()
#: Most forgotten verdict readers remembered, so one that comes back gets verdicts again.
_FORGOTTEN_READERS = 4096


class ReaderActs:
    """What a grantor's readers say, handled one notification at a time, and
    the answers it sends them."""

    def __init__(
        self,
        opts: RankOptions,
        table: LeaseTable,
        backend: KVBackend,
        metrics: PrefillMetrics,
        *,
        blocks: dict[str, list[int]],
        binding: ReaderBinding,
        drops: DropLog,
        notes: DropLog,
        release: Callable[[Release], None],
        reader: Callable[[str, wire.Message], bool] | None = None,
        sent: Callable[[str], None] | None = None,
    ) -> None:
        """``table``, ``blocks``, ``binding``: the grants' (shared, not copied);
        ``release``: frees the blocks of a lease the core just ended;
        ``reader``, ``sent``: as :class:`~.prefill_leases.LeaseGrants` takes them."""
        self.opts = opts
        self.table = table
        self.backend = backend
        self.metrics = metrics
        self.blocks = blocks
        self.binding = binding
        self.drops = drops
        self.notes = notes
        self._release = release
        self._reader = reader
        self._sent = sent
        #: readers that said they understand verdicts (agent names)
        self.verdict_readers: set[str] = set()
        #: verdict readers forgotten (oldest first), restored when heard again
        self.forgotten_readers: OrderedDict[str, None] = OrderedDict()
        self.verdicts_sent = dict.fromkeys(("ok", "nk", "ll", "hello"), 0)
        self.nacks_sent = 0
        self.heartbeats_received = 0
        self.malformed = 0

    def forget(self, agent: str) -> None:
        """``agent`` is forgotten (silent): a verdict reader among the last
        few thousand forgotten gets verdicts again once heard."""
        if agent in self.verdict_readers:
            self.verdict_readers.discard(agent)
            self.forgotten_readers[agent] = None
            if len(self.forgotten_readers) > _FORGOTTEN_READERS:
                self.forgotten_readers.popitem(last=False)

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
            self._release(out)
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
        cost); False when that path does not take it (:meth:`handle` then
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

    def handle(self, sender: str, payload: bytes, now: float) -> None:
        """Handle one notification from ``sender``, polled at ``now``."""
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
                self._release(rel)
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
