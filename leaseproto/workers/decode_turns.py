"""D as a grantor: the KV of finished turns, cached for the conversation's next
turn and held under leases in D's own core ``LeaseTable`` (issue 18).

When a request of a conversation finishes on D, its blocks hold the whole
turn (prompt + generated tokens but the last, ``decode(keep=True)``); instead
of freeing them D grants them a lease (initial lease ``decoder_kv_blocks_ttl``,
``max_lease_lifetime`` caps it; trace ``grant`` with ``"kind": "turn"``) bound
to the P agents that served the turn, and tells the router where they are
(:meth:`TurnGrants.keep`). P reads them as the prefix of the next turn.

What comes in from P for these leases (``HB:`` renewals while the turn-2
request waits in P's queue, the transfer-done of P's READ, ``AB:``) is
handled by the very code P uses for its own leases
(:class:`~.prefill_leases.PrefillLeases`): verdicts ``OK``/``NK`` to a reader
that greeted ``leaseproto/1``, ``LL`` for a heartbeat naming a lease that is
gone, blocks freed exactly when the core returns a ``Release`` (a transfer-done
that completes the lease, expiry, abort). :class:`TurnGrants` owns that state
and is composed into the decode worker, which hands it the notifications
meant for a grantor (:func:`for_grantor`).

Not done here: forgetting silent agents (P's ``_forget_silent``) would drop
NIXL metadata D's own reads of P depend on, so a grantor on D forgets no one.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import OrderedDict
from typing import Any

from ..core import wire
from ..core.events import Release
from ..core.peer import PARAMS_KEY, advertisement
from ..core.table import LeaseTable
from .backend import KVBackend
from .decode_state import DecodeOptions, Req
from .metrics import DecodeMetrics, PrefillMetrics, stats_dict
from .notifications import DropLog, Inbox, NotificationGate
from .prefill_binding import ReaderBinding
from .prefill_leases import PrefillLeases

__all__ = ["TurnGrants", "for_grantor"]

log = logging.getLogger("leaseproto.decode.turns")


def for_grantor(payload: bytes) -> bool:
    """Whether a notification is a reader's act for a grantor's lease (``HB:``,
    ``AB:``, a transfer-done ``<id>:<n>``) rather than a verdict or ``LL``."""
    try:
        msg = wire.decode(payload)
    except wire.MalformedMessage:
        return False
    return isinstance(msg, (wire.Heartbeat, wire.TransferDone, wire.Abort))


class TurnGrants(PrefillLeases):
    """D's leases on cached turns (the grantor side of the decode worker)."""

    def __init__(
        self,
        opts: DecodeOptions,
        backend: KVBackend,
        gate: NotificationGate,
        served: DecodeMetrics | None = None,
    ) -> None:
        """``served``: the decode worker's metrics, where the turn counters go
        (the grant code's own :class:`PrefillMetrics` here is not served)."""
        self.served = served
        self.opts = opts
        self.engine_id = opts.engine_id
        self.config = opts.config
        self.table = LeaseTable(opts.config)
        self.backend = backend
        self.metrics = PrefillMetrics(
            f"{opts.engine_id}-turns", opts.rank, table_stats=lambda: self.table.stats
        )
        self.blocks: dict[str, list[int]] = {}
        self.gate = gate
        self.inbox = Inbox()
        self.drops = DropLog(log)
        self.notes = DropLog(log, prefix="")
        self.binding = ReaderBinding(ended_capacity=opts.config.tombstone_capacity)
        self.agents_forgotten = 0
        self.forgotten_readers: OrderedDict[str, None] = OrderedDict()
        self.verdict_readers: set[str] = set()
        self.verdicts_sent = dict.fromkeys(("ok", "nk", "ll", "hello"), 0)
        self.last_release_at: float | None = None
        self.nacks_sent = 0
        self.heartbeats_received = 0
        self.malformed = 0
        self.granted = 0
        self._now = -math.inf
        self._advert = {PARAMS_KEY: advertisement(opts.config)}

    def _clock(self) -> float:
        self._now = max(self._now, time.monotonic())
        return self._now

    def _send(self, sender: str, payload: bytes, kind: str) -> None:
        before = self.verdicts_sent[kind]
        super()._send(sender, payload, kind)
        if self.served is not None and self.verdicts_sent[kind] > before:
            self.served.turn_verdicts.labels(verdict=kind).inc()

    def _release(self, rel: Release) -> None:
        super()._release(rel)
        if self.served is not None:
            self.served.turn_releases.labels(reason=rel.reason.value).inc()
            self.served.turn_blocks_held.set(sum(len(b) for b in self.blocks.values()))

    def _forget_silent(self) -> None:
        """D's endpoint is shared with its reads of P: nobody is forgotten here."""

    def keep(self, req: Req) -> dict[str, Any] | None:
        """Grant a lease on ``req``'s blocks (the whole turn) and return where
        they are, for the router (the blocks are then this table's); None
        when the lease could not be granted (the caller frees the blocks)."""
        covered = req.num_tokens + req.max_tokens - 1
        lease_id = f"turn-{secrets.token_hex(8)}"
        now = self._clock()
        ttl = self.config.decoder_kv_blocks_ttl
        cap = self.config.max_lease_lifetime
        if cap is not None:  # the cap bounds the fixed TTL too, not only renewals
            ttl = min(ttl, cap)
        rel = self.table.grant(lease_id, now=now, consumers=1, ttl=ttl)
        if rel is not None:  # cannot happen for a fresh id; never keep blocks unleased
            self.table.abort(lease_id, now=now)
            return None
        blocks, req.blocks = req.blocks, []
        self.blocks[lease_id] = blocks
        readers = tuple(r.agent for r in req.ranks)
        self.binding.name(lease_id, readers)
        self.granted += 1
        if self.served is not None:
            self.served.turns_cached.inc()
            self.served.turn_blocks_held.set(sum(len(b) for b in self.blocks.values()))
        deadline = self.table.deadline(lease_id)
        remaining = 0.0 if deadline is None else deadline - now
        self.backend.trace.emit(
            "grant",
            now=now,
            req=lease_id,
            kind="turn",
            turn=req.req_id,
            consumers=1,
            blocks=len(blocks),
            lease=remaining,
            readers=list(readers),
        )
        log.info(
            "cached turn %s: %d tokens in %d blocks, lease %s for %.1f s",
            req.req_id,
            covered,
            len(blocks),
            lease_id,
            remaining,
        )
        return {
            "remote_req_id": lease_id,
            "engine_id": self.engine_id,
            "num_tokens": covered,
            "ranks": [  # rank 0 holds every head of the whole turn
                {
                    "rank": 0,
                    "tp": 1,
                    "agent": self.backend.agent_name,
                    "host": self.opts.host,
                    "nixl_port": self.backend.nixl_port,
                    "block_ids": blocks[: self.backend.pool.blocks_needed(covered)],
                    "layout": self.backend.layout(),
                    "lease_remaining": remaining,
                    **self._advert,
                }
            ],
        }

    def stats(self) -> dict[str, Any]:
        return {
            "turns_cached": self.granted,
            "turn_leases_live": len(self.table),
            "turn_blocks_held": sum(len(b) for b in self.blocks.values()),
            "turn_verdicts_sent": dict(self.verdicts_sent),
            "turn_heartbeats_received": self.heartbeats_received,
            "turn_acts_refused": dict(self.binding.refused),
            "turn_table": stats_dict(self.table.stats),
        }

    def close(self) -> None:
        """Free every cached turn (the worker is stopping)."""
        for blocks in self.blocks.values():
            self.backend.free(blocks)
        self.blocks.clear()
