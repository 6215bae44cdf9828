"""A grantor's leases (:class:`LeaseGrants`): the leases it grants, the
blocks it frees and its lease step. A part of the prefill worker (P's leases
on prefilled prompts) and of the decode worker (D's leases on cached turns,
:class:`~.decode_turns.TurnGrants`), owning its state: the core's
``LeaseTable``, the blocks each lease holds, the readers each is bound to
(:class:`~.prefill_binding.ReaderBinding`), the inbox, the clock, and when
silent readers were last looked for. What the readers say over NIXL, and the
verdicts sent back (verified reads, I13), are its part
:class:`~.prefill_acts.ReaderActs` (``acts``), which owns which readers take
verdicts and what was answered.

Every notification goes through the gate (size cap, known senders) and the
inbox (round-robin per sender, each handled at its poll instant) to
``acts.handle``; then ``expire``, once every notification polled so far is
handled. Blocks are freed exactly when the core returns a
:class:`~leaseproto.Release` (:meth:`LeaseGrants.release`).

Readers bound to no live lease and silent for ``tombstone_ttl`` (at least two
lease extensions) are forgotten, their NIXL agent removed (not where the
endpoint also serves the worker's own reads, nor agents those reads use).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from ..core import wire
from ..core.events import Release, ReleaseReason
from ..core.table import LeaseTable
from .metrics import PrefillMetrics
from .notifications import DropLog, Inbox, NotificationGate
from .prefill_acts import ReaderActs
from .prefill_binding import ReaderBinding

if TYPE_CHECKING:
    from .backend import KVBackend
    from .loop import RankOptions

__all__ = ["LeaseGrants"]

log = logging.getLogger("leaseproto.prefill")

#: Longest one loop turn spends handling queued notifications, seconds.
_INBOX_BUDGET_S = 0.02
#: Seconds between two looks for silent decoders to forget.
_PRUNE_EVERY_S = 1.0


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
        self._forgets = forget_silent
        self._in_use = in_use
        self._released = released
        #: lease id -> the blocks held under it
        self.blocks: dict[str, list[int]] = {}
        self.inbox = Inbox()
        #: which D agents may act for each live lease (spec §10.2)
        self.binding = ReaderBinding(ended_capacity=opts.config.tombstone_capacity)
        #: what the readers say, and the verdicts they are sent
        self.acts = ReaderActs(
            opts,
            table,
            backend,
            metrics,
            blocks=self.blocks,
            binding=self.binding,
            drops=drops,
            notes=notes,
            release=self.release,
            reader=reader,
            sent=sent,
        )
        self.agents_forgotten = 0
        self.last_release_at: float | None = None
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
            self.acts.forget(agent)
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
            self.acts.handle(sender, payload, self._now)
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
