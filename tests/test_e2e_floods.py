"""End to end, notification floods and strangers (issue 9, section 5): P drops
and counts notifications over its size cap, a burst of large heartbeats does
not expire a single lease D keeps alive, malformed input leaves a bounded
trace in P's log, and an agent P never exchanged metadata with cannot keep a
dead D's blocks alive.

Requests wait on D (one runs at a time) for longer than the initial lease,
so only D's heartbeats keep their blocks while the flood goes on.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_workers import (
    EXTENSION,
    LEASE,
    Cluster,
    heartbeat_dead_ds_leases,
    prompts,
    reference,
    spec,
    submit_until_waiting,
    wait_for,
)
from e2e_workers import injector as make_injector

from leaseproto.adapters.nixl import NixlEndpoint, free_port, load_nixl

pytestmark = pytest.mark.e2e

MiB = 1 << 20
TOKENS = 12


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(max_running=1, d_step_time=0.05)) as c:
        yield c


@pytest.fixture
def injector(cluster: Cluster) -> Iterator[NixlEndpoint]:
    """A third NIXL agent that exchanged metadata with P (a known peer)."""
    with make_injector(cluster, "flood") as ep:
        yield ep


def _big_heartbeat(size: int, salt: str) -> bytes:
    """A well-formed heartbeat of about ``size`` bytes naming ids P never granted."""
    n = size // 12
    return b"HB:" + ",".join(f"{salt}{i:08d}" for i in range(n)).encode()


def _flood_while_waiting(
    cluster: Cluster, send: Any, tag: str, n: int = 8
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Submit ``n`` requests; once they wait on D under heartbeats, call
    ``send()``; the answers and P's stats before and after."""
    before = cluster.stats(cluster.prefill[0])
    client = cluster.client()
    try:
        batch = submit_until_waiting(client, cluster, tag, n, TOKENS)
        send()
        results = client.wait_all(deadline=time.monotonic() + 60.0)
    finally:
        client.close()
    for i, p in enumerate(batch):
        r = results[f"{tag}{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(p, TOKENS), f"{tag}{i} differs from the reference"
    assert max(r["_latency"] for r in results.values()) > LEASE, "nothing waited past the lease"
    wait_for(
        lambda: cluster.stats(cluster.prefill[0])["leases_live"] == 0,
        "P to hold no lease",
        timeout=LEASE + EXTENSION + 5,
    )
    return results, before, cluster.stats(cluster.prefill[0])


def _no_lease_lost(before: dict[str, Any], after: dict[str, Any]) -> None:
    t0, t1 = before["table"], after["table"]
    assert t1["released_expired"] == t0["released_expired"], "a live lease expired"
    assert t1["late_transfers"] == t0["late_transfers"]


def test_oversized_notifications_are_dropped_and_counted(
    cluster: Cluster, injector: NixlEndpoint
) -> None:
    agent = cluster.prefill[0].info["agent"]
    big = _big_heartbeat(MiB, "o")

    def send() -> None:
        for _ in range(4):
            assert injector.send(agent, big)

    _, before, after = _flood_while_waiting(cluster, send, "ov")
    _no_lease_lost(before, after)
    assert after["oversized"] - before["oversized"] == 4


def test_heartbeat_burst_under_the_cap_expires_no_live_lease(
    cluster: Cluster, injector: NixlEndpoint
) -> None:
    agent = cluster.prefill[0].info["agent"]
    cap = cluster.stats(cluster.prefill[0]).get("max_notification_in", 64 * 1024)
    hb = _big_heartbeat(cap - 64, "u")
    count = max(8, 8 * MiB // len(hb))  # about 8 MiB of ids, several seconds of P's loop

    def send() -> None:
        for _ in range(count):
            assert injector.send(agent, hb)

    _, before, after = _flood_while_waiting(cluster, send, "un")
    _no_lease_lost(before, after)
    # P handles the whole burst (it may still be at it when the answers are in)
    wait_for(
        lambda: (
            cluster.stats(cluster.prefill[0])["heartbeats_received"] - before["heartbeats_received"]
            >= count
        ),
        "P to handle the whole burst",
        timeout=60.0,
    )


def test_malformed_input_leaves_a_bounded_log(cluster: Cluster, injector: NixlEndpoint) -> None:
    p = cluster.prefill[0]
    agent = p.info["agent"]
    size0 = p.log_path.stat().st_size
    before = cluster.stats(p)
    bad = [b"HB:" + b"x" * MiB, b"HB:" + b"y" * 60_000, b"z" * 60_000 + b":1"]
    bad += [f"HB:bad\x01{i}".encode() for i in range(300)]
    for payload in bad:
        assert injector.send(agent, payload)
    wait_for(
        lambda: (
            (s := cluster.stats(p))["malformed"] + s.get("oversized", 0)
            >= before["malformed"] + before.get("oversized", 0) + len(bad)
        ),
        "P to drop every bad notification",
        timeout=15.0,
    )
    time.sleep(1.5)  # let a rate-limited summary be written
    grown = p.log_path.stat().st_size - size0
    assert grown < 32 * 1024, f"P's log grew by {grown} bytes for {len(bad)} bad notifications"
    assert "malformed" in p.log_tail(400)
    assert p.alive()


def test_a_stranger_cannot_keep_a_dead_ds_blocks(cluster: Cluster) -> None:
    """Last in the module: it kills D."""
    p = cluster.prefill[0]
    nixl = load_nixl()
    name = f"stranger-{secrets.token_hex(3)}"
    port = free_port()
    stranger = nixl.nixl_agent(
        name, nixl.nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
    )
    # it fetches P's metadata (so it can send) but never gives P its own
    stranger.fetch_remote_metadata(p.info["agent"], "127.0.0.1", p.info["nixl_port"])
    wait_for(lambda: stranger.check_remote_metadata(p.info["agent"]), "the stranger's fetch")
    before = cluster.stats(p)
    batch = prompts(6, seed=73)
    client = cluster.client()
    try:
        for i, pr in enumerate(batch):
            client.submit(f"k{i}", pr, TOKENS)
        wait_for(lambda: cluster.stats(cluster.decode[0])["waiting"] >= 3, "requests waiting on D")
        killed = cluster.kill(cluster.decode[0])
    finally:
        client.close()
    _, freed = heartbeat_dead_ds_leases(
        cluster, lambda hb: stranger.send_notif(p.info["agent"], hb), killed
    )
    assert freed is not None, "a stranger's heartbeats kept a dead D's blocks"
    assert cluster.stats(p)["unknown_sender"] > before["unknown_sender"]
