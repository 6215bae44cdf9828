"""End to end, a cluster with a cluster key (``--cluster-key-file``, spec
§10.3): it serves verified requests with a 2-rank D; a client without the key
(or with another one) gets no answer from any worker; a third NIXL agent that
pushed its metadata to P but has no key renews nothing (its forged heartbeats
are counted and dropped, the lease expires on time); and D refuses transfer
parameters whose P does not advertise D's key."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_workers import EXTENSION, LEASE, Cluster, p_settled, prompts, reference, run_batch, spec
from polling import wait_for

from leaseproto.adapters.nixl import NixlEndpoint, free_port
from leaseproto.core.mac import ClusterKey
from leaseproto.core.mac_peers import GREETING, PeerAuth
from leaseproto.workers.keys import CurveKeys
from leaseproto.workers.plane import call

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "cluster.key"
    path.write_text(secrets.token_hex(32) + "\n")
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="module")
def cluster(key_file: Path) -> Iterator[Cluster]:
    with Cluster(spec(d_tp=2, max_running=2, cluster_key_file=str(key_file))) as c:
        yield c


def _auth(stats: dict[str, Any]) -> dict[str, int]:
    dropped: dict[str, int] = stats["auth_dropped"]
    return dropped


def test_a_keyed_cluster_serves_verified_requests(cluster: Cluster) -> None:
    d0 = cluster.stats(cluster.decode[0])
    batch = prompts(4, seed=170)
    results = run_batch(cluster, batch, "k")
    for i, prompt in enumerate(batch):
        r = results[f"k{i}"]
        assert r["ok"], r
        assert r["tokens"] == reference(prompt), f"k{i} differs from the reference"
        assert not r["recomputed"], r
    d1 = cluster.stats(cluster.decode[0])
    assert d1["verified_reads"] - d0["verified_reads"] == len(batch)
    assert d1["verdict_timeouts"] == d0["verdict_timeouts"]
    p = p_settled(cluster)[0]
    assert p["verdicts_sent"]["ok"] >= 2 * len(batch)  # both D ranks read P's one rank
    assert p["table"]["released_transferred"] >= len(batch)
    assert p["cluster_key"] == d1["cluster_key"]
    for w in [*cluster.prefill, *cluster.decode]:  # nothing of ours was refused anywhere
        assert not any(_auth(cluster.stats(w)).values()), w.name
        log = w.log_path.read_text()
        assert log.count("control plane authenticated with cluster key") == 1, w.name
        assert "UNAUTHENTICATED" not in log


@pytest.mark.parametrize("keys", ["none", "another key"])
def test_the_request_plane_answers_no_client_without_the_key(cluster: Cluster, keys: str) -> None:
    curve = None if keys == "none" else CurveKeys.from_key(ClusterKey.from_bytes(b"x" * 32 + b"!"))
    assert cluster.router is not None
    for w in [cluster.router, *cluster.prefill, *cluster.decode]:
        with pytest.raises(TimeoutError):
            call(w.address, {"op": "ping"}, timeout=1.0, curve=curve)
    assert call(cluster.router.address, {"op": "ping"}, timeout=5.0, curve=cluster.curve)["ready"]


def test_a_third_agent_without_the_key_renews_nothing(cluster: Cluster) -> None:
    """The third agent pushes its metadata to P (a peer in NIXL's eyes) and
    heartbeats a lease no D reads: unsealed, and sealed under another key. P
    drops and counts every one, and the lease expires one initial lease after
    the grant; without the key it would be renewed as long as they come."""
    p, d = cluster.prefill[0], cluster.decode[0]
    agent = p.info["agent"]
    rid = f"orphan-{secrets.token_hex(8)}"
    granted = call(
        p.address,
        {"op": "prefill", "req_id": rid, "prompt": prompts(1, seed=171)[0]},
        timeout=10,
        curve=cluster.curve,
    )
    assert granted["op"] == "prefilled", granted
    before, d_before = cluster.stats(p), cluster.stats(d)
    ep = NixlEndpoint(f"stranger-{secrets.token_hex(3)}", port=free_port(), progress_thread=True)
    forger = PeerAuth(ClusterKey.from_bytes(secrets.token_bytes(32)), ep.name)
    sent = 0
    try:
        ep.connect(agent, "127.0.0.1", p.info["nixl_port"])
        ep.connect(d.info["agent"], "127.0.0.1", d.info["nixl_port"])
        wait_for(
            lambda: ep.is_connected(agent) and ep.is_connected(d.info["agent"]),
            "the third agent's handshakes",
        )
        for forged in (f"LL:expired:{rid}", f"OK:{rid}", f"NK:expired:{rid}"):  # to D
            assert ep.send(d.info["agent"], forged.encode())
        forged_greeting = forger.seal(agent, GREETING)
        assert forged_greeting is not None and ep.send(agent, forged_greeting)
        end = time.monotonic() + LEASE + EXTENSION + 1.0
        while time.monotonic() < end and cluster.stats(p)["leases_live"] > 0:
            assert ep.send(agent, f"HB:{rid}".encode())
            assert ep.send(agent, f"{rid}:1".encode())
            sent += 2
            time.sleep(0.2)
        after = cluster.stats(p)
    finally:
        ep.close()
    assert after["leases_live"] == 0, "forged heartbeats kept the lease alive"
    t0, t1 = before["table"], after["table"]
    assert t1["released_expired"] - t0["released_expired"] == 1
    assert t1["released_transferred"] == t0["released_transferred"]  # no forged completion
    dropped = {k: _auth(after)[k] - _auth(before)[k] for k in _auth(after)}
    assert dropped["bad mac"] >= 1  # the greeting under another key
    assert dropped["unauthenticated"] >= sent - 4  # the last few may still be in flight
    assert after["heartbeats_received"] == before["heartbeats_received"]
    assert after["verdict_readers"] == before["verdict_readers"]
    d_after = cluster.stats(d)
    # dropped by the key, or before it: D never fetched this agent's metadata, so
    # it refuses the metadata the agent pushed and drops its notifications as a
    # stranger's (names bound to addresses, spec §10.2)
    unsealed = _auth(d_after)["unauthenticated"] - _auth(d_before)["unauthenticated"]
    assert unsealed + d_after["unknown_sender"] - d_before["unknown_sender"] == 3
    assert d_after["lease_lost"] == d_before["lease_lost"]
    assert d_after["nacks"] == d_before["nacks"]


def test_decode_refuses_a_p_that_does_not_advertise_its_key(cluster: Cluster) -> None:
    p = cluster.prefill[0]
    prompt = prompts(1, seed=172)[0]
    rid = f"nokey-{secrets.token_hex(8)}"
    rank = call(
        p.address,
        {"op": "prefill", "req_id": rid, "prompt": prompt},
        timeout=10,
        curve=cluster.curve,
    )
    assert rank.pop("op") == "prefilled"
    rank["leaseproto"].pop("auth")
    msg = {
        "op": "decode",
        "req_id": f"d-{secrets.token_hex(8)}",
        "prompt": prompt,
        "max_tokens": 4,
        "params": {"remote_req_id": rid, "engine_id": rank["engine_id"], "ranks": [rank]},
    }
    got = call(cluster.decode[0].address, msg, timeout=10, curve=cluster.curve)
    assert got["op"] == "decoded" and not got["ok"], got
    assert "advertised no cluster key" in got["error"], got
    # P frees it at expiry (the router would abort it): nothing else is left behind
    p_settled(cluster)
