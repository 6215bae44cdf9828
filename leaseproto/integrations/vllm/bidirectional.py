"""Bidirectional mode (``bidirectional_kv_xfer``): D grants, P reads and verifies (I14).

When a multi-turn request finishes on D, vLLM keeps its blocks for
``decoder_kv_blocks_ttl`` in the same ``_reqs_need_send``/``_reqs_to_send`` maps
as P's leases; in :class:`~.worker.LeaseprotoConnectorWorker` those maps are the
core's ``LeaseTable``, so D's cached turn is a lease in D's own table (initial
lease ``decoder_kv_blocks_ttl``, renewed by ``HB:``, ended by P's transfer-done,
by expiry or by abort). This module holds what changes beside that:

- D advertises ``leaseproto/1`` in the parameters it returns for the turn
  (:func:`turn_advert`, ``"kind": "turn"``), so a leaseproto P greets D and
  verifies its read exactly as D verifies its reads of P (I13 mirrored): the
  prefix is used only after ``OK:`` from every D rank read, else it is a failed
  recv and vLLM's recompute path takes over.
- P heartbeats D for a turn-2 request from ``on_new_request`` until its read is
  done (:func:`turn2_heartbeat_target`): ``HB:`` naming D's ids, batched per D
  engine and throttled by the same ``HeartbeatTracker`` D uses toward P.
- vLLM's clock-offset gate (5 s margin) stays as the pre-check (I9).

A stock D advertises nothing: P reads its cached turn unverified, as stock vLLM
does, heartbeats nothing and says so once per D engine. A stock P ignores D's
advertisement (an unknown key in the transfer parameters).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TURN_KIND", "turn2_heartbeat_target", "turn_advert"]

#: ``kind`` of D's advertisement for a cached turn (P's, for its prefill lease, has none).
TURN_KIND = "turn"


def turn_advert(advert: dict[str, Any], ttl: float) -> dict[str, Any]:
    """D's advertisement for a cached turn: P's form, with the initial lease
    ``decoder_kv_blocks_ttl`` and ``"kind": "turn"``."""
    lease = {**advert.get("lease", {}), "kv_lease_duration": float(ttl)}
    return {**advert, "kind": TURN_KIND, "lease": lease}


def is_cached_turn(params: dict[str, Any]) -> bool:
    """The parameters D's ``request_finished`` returns for a cached turn."""
    return bool(params.get("do_remote_decode")) and (
        params.get("remote_blocks_expiry_time") is not None
    )


def turn2_heartbeat_target(params: dict[str, Any] | None, key: str) -> tuple[str, str] | None:
    """For a turn-2 request entering P's queue: (D engine, D's request id) to
    heartbeat, when D advertised ``leaseproto/1`` for the turn (a stock D gets
    nothing of ours) and there are D blocks to read."""
    if not params or not params.get("do_remote_decode"):
        return None
    advert = params.get(key)
    if not isinstance(advert, dict) or advert.get("kind") != TURN_KIND:
        return None
    blocks = params.get("remote_block_ids")
    if not blocks or not any(len(g) > 0 for g in blocks):
        return None
    engine, remote = params.get("remote_engine_id"), params.get("remote_request_id")
    if not isinstance(engine, str) or not isinstance(remote, str):
        return None
    if params.get("remote_host") is None or params.get("remote_port") is None:
        return None
    return engine, remote
