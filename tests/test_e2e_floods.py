"""End to end, notification floods and strangers (issue 9, section 5): P drops
and counts notifications over its size cap, a burst of large heartbeats does
not expire a single lease D keeps alive, malformed input leaves a bounded
trace in P's log, and an agent P never exchanged metadata with cannot keep a
dead D's blocks alive.

Requests wait on D (one runs at a time) for longer than the initial lease,
so only D's heartbeats keep their blocks while the flood goes on.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_workers import (
    EXTENSION,
    HEARTBEAT,
    LEASE,
    Cluster,
    prompts,
    reference,
    spec,
    wait_for,
)

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
    p = cluster.prefill[0].info
    # it runs no loop: NIXL's progress thread moves its sends
    ep = NixlEndpoint(f"flood-{secrets.token_hex(3)}", port=free_port(), progress_thread=True)
    try:
        ep.connect(p["agent"], "127.0.0.1", p["nixl_port"])
        wait_for(lambda: ep.is_connected(p["agent"]), "the injector's handshake")
        _until_p_admits(cluster, ep)
        yield ep
    finally:
        ep.close()


def _until_p_admits(cluster: Cluster, ep: NixlEndpoint, timeout: float = 30.0) -> None:
    """Wait until P treats ``ep`` as a peer: P holds notifications from an agent
    whose metadata has not reached it yet (at most 256, for 1 s) and counts the
    rest as ``unknown_sender``, so a flood sent before that would be counted
    there, not where a test looks. A probe heartbeat naming no lease is
    counted as received only once P has admitted it."""
    p = cluster.prefill[0]
    agent = p.info["agent"]
    deadline = time.monotonic() + timeout
    while True:
        seen = cluster.stats(p)["heartbeats_received"]
        assert ep.send(agent, f"HB:probe-{secrets.token_hex(4)}".encode())
        end = min(deadline, time.monotonic() + 2.0)
        while time.monotonic() < end:
            if cluster.stats(p)["heartbeats_received"] > seen:
                return
            time.sleep(0.02)
        if time.monotonic() >= deadline:
            pytest.fail(f"P never admitted a notification from {ep.name} in {timeout:g} s")


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
    batch = prompts(n, seed=hash(tag) % 1000)
    client = cluster.client()
    try:
        for i, p in enumerate(batch):
            client.submit(f"{tag}{i}", p, TOKENS)
        wait_for(
            lambda: (
                cluster.stats(cluster.decode[0])["waiting"] >= 3
                and cluster.stats(cluster.prefill[0])["leases_live"] >= 3
            ),
            "requests waiting on D under live leases",
        )
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
    # the ids of P's live leases, from P's log
    granted = set(re.findall(r"granted req (\S+) a ", p.log_path.read_text()))
    released = set(re.findall(r"released \d+ blocks of req (\S+):", p.log_path.read_text()))
    live = sorted(granted - released)
    assert live, "no live lease to attack"
    payload = ("HB:" + ",".join(live)).encode()
    deadline = killed + EXTENSION + HEARTBEAT + 2.0
    freed = None
    while time.monotonic() < deadline:
        stranger.send_notif(p.info["agent"], payload)
        if cluster.stats(p)["leases_live"] == 0:
            freed = time.monotonic()
            break
        time.sleep(0.2)
    assert freed is not None, "a stranger's heartbeats kept a dead D's blocks"
    assert cluster.stats(p)["unknown_sender"] > before["unknown_sender"]
