"""End to end, verified reads (I13) with a 2-rank D and a 1-rank P: every
transfer-done is answered OK or NK, D uses what it read only after OK from
the P rank each of its ranks read from, P grants with ``consumers=1`` and
counts its readers from the transfer-dones' ``n``, and a replayed ``decode``
message (a read of blocks P freed and reused) is recomputed instead of
answered with wrong tokens."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_workers import Cluster, p_settled, prompts, reference, run_batch, spec

from leaseproto.workers.plane import call

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(d_tp=2, max_running=2, d_step_time=0.02)) as c:
        yield c


def _prefill(cluster: Cluster, prompt: list[int]) -> dict[str, Any]:
    """A prefill asked of P directly, as our router asks it (no ``d_tp``: the
    grant says one consumer; ``readers``: the decode engine's agents, which the
    lease is bound to, spec §10.2)."""
    rid = f"v-{secrets.token_hex(8)}"
    readers = [w.info["agent"] for w in cluster.decode]
    msg = {"op": "prefill", "req_id": rid, "prompt": prompt, "readers": readers}
    got = call(cluster.prefill[0].address, msg, timeout=10)
    assert got["op"] == "prefilled" and got["consumers"] == 1, got
    got.pop("op")
    return got


def _decode(cluster: Cluster, msg: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = call(cluster.decode[0].address, msg, timeout=30)
    assert got["op"] == "decoded", got
    return got


def _decode_msg(rank: dict[str, Any], prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {
        "op": "decode",
        "req_id": f"d-{secrets.token_hex(8)}",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "params": {
            "remote_req_id": rank["req_id"],
            "engine_id": rank["engine_id"],
            "ranks": [rank],
        },
    }


def test_two_rank_d_reads_a_one_consumer_lease(cluster: Cluster) -> None:
    p = cluster.prefill[0]
    before = cluster.stats(p)
    batch = prompts(4, seed=80)
    for prompt in batch:
        got = _decode(cluster, _decode_msg(_prefill(cluster, prompt), prompt, 6))
        assert got["ok"], got
        assert got["tokens"] == reference(prompt, 6)
        assert not got["recomputed"]
    after = p_settled(cluster)[0]
    t0, t1 = before["table"], after["table"]
    # the lease ended at the second reader's transfer-done, not the first
    assert t1["released_transferred"] - t0["released_transferred"] == len(batch)
    assert t1["excess_transfers"] == t0["excess_transfers"]
    assert t1["late_transfers"] == t0["late_transfers"]
    assert after["verdicts_sent"]["ok"] - before["verdicts_sent"]["ok"] == 2 * len(batch)
    assert after["verdicts_sent"]["nk"] == before["verdicts_sent"]["nk"]


def test_every_read_through_the_router_is_verified(cluster: Cluster) -> None:
    d = cluster.decode[0]
    before = cluster.stats(d)
    batch = prompts(6, seed=81)
    results = run_batch(cluster, batch, "vr")
    for i, prompt in enumerate(batch):
        r = results[f"vr{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(prompt)
        assert not r["recomputed"]
    after = cluster.stats(d)
    assert after["verified_reads"] - before["verified_reads"] == len(batch)
    assert after["verdicts_nk"] == before["verdicts_nk"]


def test_a_replayed_decode_message_is_recomputed(cluster: Cluster) -> None:
    """Replay a decode message after P freed its blocks and reused them for
    another prompt: the read sees the other prompt's KV; P answers NK
    (transferred) and D recomputes."""
    for k in range(3):
        prompt, other = prompts(2, seed=90 + k, length=16)
        rank = _prefill(cluster, prompt)
        msg = _decode_msg(rank, prompt, 6)
        first = _decode(cluster, msg)
        assert first["ok"] and first["tokens"] == reference(prompt, 6), first
        assert not first["recomputed"]
        reused = _prefill(cluster, other)  # P's free list hands out the same blocks
        assert set(reused["block_ids"]) & set(rank["block_ids"]), "blocks not reused"
        again = _decode(cluster, {**msg, "req_id": f"replay-{secrets.token_hex(8)}"})
        assert again["ok"], again
        assert again["tokens"] == reference(prompt, 6), f"replay {k} answered wrong tokens"
        assert again["recomputed"], "a read of reused blocks was used"
