"""Multi-turn faults through real processes (issue 18, I14 and I16).

* P overloaded: a turn-2 request waits in P's queue far past D's initial
  cached lease (``decoder_kv_blocks_ttl`` 1.5 s); P's heartbeats keep D's
  blocks and the prefix is read verified;
* P killed while its turn-2 request waits: D frees the cached blocks within
  ``lease_extension`` of P's last heartbeat (I6 on D's table);
* P stalls after the gate admitted its read, past D's deadline: D answers the
  late transfer-done NK, P recomputes the prefix, the output is still the
  reference (no token from freed or reused D blocks).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e_workers import ANSWER_S, EXTENSION, Cluster, prompts, reference, spec, wait_for

from leaseproto.harness.client import RouterClient

pytestmark = pytest.mark.e2e

NEW = 6
TTL = 1.5


def turn_spec(**kw: Any) -> Any:
    return spec(decoder_kv_blocks_ttl=TTL, safety_margin=0.2, **kw)


def answer(client: RouterClient, rid: str) -> dict[str, Any]:
    deadline = time.monotonic() + ANSWER_S
    while rid not in client.results and time.monotonic() < deadline:
        client.poll(0.2)
    assert rid in client.results, f"no answer for {rid}"
    return client.results[rid]


def first_turn(client: RouterClient, conv: str) -> tuple[list[int], list[int]]:
    """Turn 1 of ``conv``; (the next turn's prompt, its reference)."""
    prompt = prompts(1, seed=hash(conv) % 1000, length=8)[0]
    client.submit(f"{conv}.0", prompt, NEW, conversation=conv)
    r = answer(client, f"{conv}.0")
    assert r["ok"], r["error"]
    nxt = [*prompt, *r["tokens"], 7, 8, 9, 10, 11]
    return nxt, reference(nxt, NEW)


def test_I16_p_heartbeats_keep_d_cached_blocks_under_p_overload() -> None:
    with Cluster(turn_spec(p_blocks=8, max_running=1, d_step_time=0.2)) as cluster:
        client = cluster.client()
        try:
            nxt, want = first_turn(client, "o")
            for i, p in enumerate(prompts(8, seed=5, length=8)):  # 2 blocks each: P fills up
                client.submit(f"f{i}", p, NEW)
            client.submit("o.1", nxt, NEW, conversation="o")
            r = answer(client, "o.1")
        finally:
            client.close()
        assert r["ok"], r["error"]
        assert r["tokens"] == want
        # the point: it waited in P's queue well past D's initial cached lease
        assert r["_latency"] > 2 * TTL, f"only {r['_latency']:.2f} s: P was not overloaded"
        assert r["prefix"]["verified"], r["prefix"]
        d = cluster.stats(cluster.decode[0])
        p = cluster.stats(cluster.prefill[0])
        assert d["turn_heartbeats_received"] >= 2
        assert p["prefix_heartbeats_sent"] >= 2
        assert d["turn_table"]["released_expired"] == 0
        assert d["turn_table"]["released_transferred"] >= 1


def test_I16_d_frees_cached_blocks_when_p_dies() -> None:
    with Cluster(turn_spec(p_blocks=8, max_running=1, d_step_time=0.2)) as cluster:
        d = cluster.decode[0]
        client = cluster.client()
        try:
            nxt, _ = first_turn(client, "k")
            for i, p in enumerate(prompts(8, seed=6, length=8)):
                client.submit(f"f{i}", p, NEW)
            client.submit("k.1", nxt, NEW, conversation="k")
            wait_for(
                lambda: cluster.stats(d)["turn_heartbeats_received"] >= 2,
                "P heartbeating D's cached turn",
            )
            cluster.kill(cluster.prefill[0])
            killed = time.monotonic()
            wait_for(
                lambda: cluster.stats(d)["turn_leases_live"] == 0,
                "D freeing the cached turn",
                timeout=EXTENSION + 10.0,
            )
            freed = time.monotonic() - killed
        finally:
            client.close()
        stats = cluster.stats(d)
        assert stats["turn_blocks_held"] == 0
        # bound: max(granted + ttl, last heartbeat + extension) <= kill + extension
        assert freed < EXTENSION + 1.5, f"freed {freed:.2f} s after P died"
        assert stats["turn_table"]["released_expired"] == 1


def test_I14_read_admitted_by_the_gate_then_late_is_nacked_and_recomputed() -> None:
    # P stops working on the read once the gate admitted it (no heartbeat, READ not
    # posted) while its loop goes on. Stalling the whole loop right after posting the
    # READ (--stall-after-prefix-read) raced: the READ and its transfer-done could
    # complete before P slept, D answered OK in time, and the read was rightly used.
    stall = ["--stall-after-prefix-gate", "4.0"]
    with Cluster(turn_spec(extra={"prefill": stall}, d_step_time=0.05)) as cluster:
        client = cluster.client()
        try:
            nxt, want = first_turn(client, "n")
            # D reuses blocks while P stalls: other requests decode meanwhile
            for i, p in enumerate(prompts(4, seed=7, length=12)):
                client.submit(f"r{i}", p, 24)
            client.submit("n.1", nxt, NEW, conversation="n")
            r = answer(client, "n.1")
            client.wait_all(deadline=time.monotonic() + ANSWER_S)
        finally:
            client.close()
        assert r["ok"], r["error"]
        assert r["tokens"] == want  # no token computed from freed or reused D blocks
        assert r["prefix"]["verified"] is False
        assert r["prefix"]["recomputed"] == ["nack"], r["prefix"]
        d = cluster.stats(cluster.decode[0])
        assert d["turn_verdicts_sent"]["nk"] >= 1
        assert d["turn_table"]["released_expired"] >= 1
        p = cluster.stats(cluster.prefill[0])
        assert p["prefix_recomputed_nack"] == 1
