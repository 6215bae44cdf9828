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
handled by the very part P uses for its own leases
(:class:`~.prefill_leases.LeaseGrants`, composed here): verdicts ``OK``/``NK``
to a reader that greeted ``leaseproto/1``, ``LL`` for a heartbeat naming a
lease that is gone, blocks freed exactly when the core returns a ``Release``
(a transfer-done that completes the lease, expiry, abort). :class:`TurnGrants`
is a part of the decode worker, which hands it the notifications meant for a
grantor (:func:`for_grantor`).

Not done here: forgetting silent agents (P's grants do) would drop NIXL
metadata D's own reads of P depend on, so a grantor on D forgets no one.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

from ..core import wire
from ..core.events import Release
from ..core.peer import PARAMS_KEY, advertisement
from ..core.table import LeaseTable
from .backend import KVBackend
from .decode_state import DecodeOptions, Req
from .metrics import DecodeMetrics, PrefillMetrics, stats_dict
from .notifications import DropLog, NotificationGate
from .prefill_leases import LeaseGrants

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


class TurnGrants:
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
        self.backend = backend
        table = LeaseTable(opts.config)
        metrics = PrefillMetrics(
            f"{opts.engine_id}-turns", opts.rank, table_stats=lambda: table.stats
        )
        self.grants = LeaseGrants(
            opts,
            table,
            backend,
            metrics,
            gate,
            drops=DropLog(log),
            notes=DropLog(log, prefix=""),
            forget_silent=False,  # D's endpoint is shared with its reads of P
            sent=self._sent if served is not None else None,
            released=self._released if served is not None else None,
        )
        self.granted = 0
        self._advert = {PARAMS_KEY: advertisement(opts.config)}

    def _sent(self, kind: str) -> None:
        assert self.served is not None
        self.served.turn_verdicts.labels(verdict=kind).inc()

    def _released(self, rel: Release) -> None:
        assert self.served is not None
        self.served.turn_releases.labels(reason=rel.reason.value).inc()
        self.served.turn_blocks_held.set(sum(len(b) for b in self.grants.blocks.values()))

    def busy(self) -> bool:
        """Whether D holds cached turns or has notifications for them queued."""
        return bool(len(self.grants.table) or self.grants.inbox)

    def grant_step(self, got: Sequence[tuple[str, bytes]]) -> None:
        """Handle ``got`` (acts for D's cached turns), then expire."""
        self.grants.grant_step(got)

    def keep(self, req: Req) -> dict[str, Any] | None:
        """Grant a lease on ``req``'s blocks (the whole turn) and return where
        they are, for the router (the blocks are then this table's); None
        when the lease could not be granted (the caller frees the blocks)."""
        covered = req.num_tokens + req.max_tokens - 1
        lease_id = f"turn-{secrets.token_hex(8)}"
        g = self.grants
        now = g.clock()
        ttl = self.config.decoder_kv_blocks_ttl
        cap = self.config.max_lease_lifetime
        if cap is not None:  # the cap bounds the fixed TTL too, not only renewals
            ttl = min(ttl, cap)
        rel = g.table.grant(lease_id, now=now, consumers=1, ttl=ttl)
        if rel is not None:  # cannot happen for a fresh id; never keep blocks unleased
            g.table.abort(lease_id, now=now)
            return None
        blocks, req.blocks = req.blocks, []
        g.blocks[lease_id] = blocks
        readers = tuple(r.agent for r in req.ranks)
        g.binding.name(lease_id, readers)
        self.granted += 1
        if self.served is not None:
            self.served.turns_cached.inc()
            self.served.turn_blocks_held.set(sum(len(b) for b in g.blocks.values()))
        deadline = g.table.deadline(lease_id)
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
        g = self.grants
        return {
            "turns_cached": self.granted,
            "turn_leases_live": len(g.table),
            "turn_blocks_held": sum(len(b) for b in g.blocks.values()),
            "turn_verdicts_sent": dict(g.acts.verdicts_sent),
            "turn_heartbeats_received": g.acts.heartbeats_received,
            "turn_acts_refused": dict(g.binding.refused),
            "turn_table": stats_dict(g.table.stats),
        }

    def close(self) -> None:
        """Free every cached turn (the worker is stopping)."""
        for blocks in self.grants.blocks.values():
            self.backend.free(blocks)
        self.grants.blocks.clear()
