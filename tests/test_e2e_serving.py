"""End to end, one prefill and one decode worker and a router (real processes,
KV moved by NIXL READs on loopback): identical tokens, a surge that waits
longer than the initial lease without a single expiry, malformed
notifications injected into a live P, and the metrics endpoints."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_workers import (
    LEASE,
    Cluster,
    p_settled,
    prompts,
    reference,
    run_batch,
    spec,
    wait_for,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(max_running=2, d_step_time=0.05)) as c:
        yield c


def test_batch_gives_the_reference_tokens(cluster: Cluster) -> None:
    batch = prompts(8, seed=11)
    results = run_batch(cluster, batch, "b")
    for i, p in enumerate(batch):
        r = results[f"b{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(p)
        assert not r["recomputed"]  # the KV came from P, not a local recompute
    stats = p_settled(cluster)[0]
    assert stats["table"]["released_transferred"] >= len(batch)
    assert stats["table"]["released_expired"] == 0


def test_surge_waits_past_the_initial_lease_without_expiry(cluster: Cluster) -> None:
    before = cluster.stats(cluster.prefill[0])["table"]
    batch = prompts(20, seed=12)
    results = run_batch(cluster, batch, "s", max_tokens=12)
    longest = max(r["_latency"] for r in results.values())
    # the point of the test: some requests sat in D's queue past the initial
    # lease, so only heartbeats kept their blocks
    assert longest > LEASE, f"the surge only took {longest:.2f} s: not a surge"
    for i, p in enumerate(batch):
        r = results[f"s{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(p, 12), f"s{i} differs from the reference"
    after = p_settled(cluster)[0]["table"]
    assert after["released_expired"] == before["released_expired"]
    assert after["late_transfers"] == before["late_transfers"]
    assert after["renewed"] > before["renewed"]
    assert after["released_transferred"] - before["released_transferred"] == len(batch)


MALFORMED = [
    b"\xff\xfe\xfd",  # not UTF-8
    b"HB:",  # heartbeat with an empty id
    b"HB:a,,b",  # empty id in the middle
    b"no separator at all",
    b"req-1:0",  # transfer-done count out of range
    b"req-1:abc",  # not a count
    b"AB:",  # abort without an id
    b"NK:expired:req-1",  # a nack: D-bound only, never valid at P
    b"x" * 5000,  # long, no separator
    b"HB:bad\x01id",  # control character in an id
]


def test_malformed_notifications_change_nothing(cluster: Cluster) -> None:
    from leaseproto.adapters.nixl import NixlEndpoint, free_port

    p_info = cluster.prefill[0].info
    before = cluster.stats(cluster.prefill[0])
    batch = prompts(6, seed=13)
    client = cluster.client()
    # the injector runs no loop: NIXL's progress thread moves its sends
    injector = NixlEndpoint(
        f"injector-{secrets.token_hex(3)}", port=free_port(), progress_thread=True
    )
    try:
        injector.connect(p_info["agent"], "127.0.0.1", p_info["nixl_port"])
        wait_for(lambda: injector.is_connected(p_info["agent"]), "the injector's handshake")
        for i, p in enumerate(batch):
            client.submit(f"m{i}", p, 12)
        # inject while leases are live and requests wait on D
        wait_for(lambda: cluster.stats(cluster.prefill[0])["leases_live"] > 0, "live leases")
        for payload in MALFORMED:
            assert injector.send(p_info["agent"], payload)
        results = client.wait_all(deadline=time.monotonic() + 60.0)
    finally:
        client.close()
        injector.close()
    for i, p in enumerate(batch):
        r = results[f"m{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(p, 12)
    after = p_settled(cluster)[0]
    wait_for(
        lambda: (
            cluster.stats(cluster.prefill[0])["malformed"] - before["malformed"] == len(MALFORMED)
        ),
        "P to count every malformed message",
        timeout=10.0,
    )
    t0, t1 = before["table"], after["table"]
    assert t1["granted"] - t0["granted"] == len(batch)
    assert t1["released_transferred"] - t0["released_transferred"] == len(batch)
    for key in (
        "released_expired",
        "released_aborted",
        "late_transfers",
        "early_staged",
        "renew_unknown",
        "excess_transfers",
    ):
        assert t1[key] == t0[key], key
    assert cluster.prefill[0].alive()


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            # every series carries engine_id and rank; key by the other labels
            name = re.sub(r'(engine_id|rank)="[^"]*",?', "", name).replace(",}", "}")
            out[name.replace("{}", "")] = float(value)
    return out


def test_metrics_are_scrapeable(cluster: Cluster) -> None:
    run_batch(cluster, prompts(2, seed=14), "x")
    p_stats = p_settled(cluster)[0]
    p = _scrape(cluster.prefill[0].info["metrics_port"])
    assert p["leaseproto_leases_granted_total"] == p_stats["table"]["granted"] > 0
    assert (
        p['leaseproto_leases_released_total{reason="transferred"}']
        == p_stats["table"]["released_transferred"]
    )
    assert p["leaseproto_heartbeats_received_total"] == p_stats["heartbeats_received"]
    assert p["leaseproto_blocks_held"] == 0
    assert "leaseproto_reclaim_after_expiry_seconds_count" in p
    d_stats = cluster.stats(cluster.decode[0])
    d = _scrape(cluster.decode[0].info["metrics_port"])
    assert d["leaseproto_heartbeats_sent_total"] == d_stats["heartbeats_sent"] > 0
    assert d["leaseproto_requests_completed_total"] == d_stats["completed"]
    assert cluster.router is not None
    r = _scrape(cluster.router.info["metrics_port"])
    assert r['leaseproto_router_requests_total{outcome="ok"}'] >= 2


def test_generate_command_prints_the_reference_tokens(cluster: Cluster, tmp_path: Path) -> None:
    """``leaseproto generate``, as a user runs it against these workers' router."""
    assert cluster.router is not None
    batch = prompts(3, seed=13)
    path = tmp_path / "reqs.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"g{i}", "prompt": p}) + "\n" for i, p in enumerate(batch[1:]))
    )
    prompt = ",".join(map(str, batch[0]))

    def generate(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "leaseproto", "generate", "--router", cluster.router.address]
        return subprocess.run(
            [*cmd, "--prompt", prompt, "--max-tokens", "6", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    r = generate("--file", str(path), "--json")
    assert r.returncode == 0, r.stderr
    got = {a["id"]: a for a in map(json.loads, r.stdout.splitlines())}
    want = {"p0": batch[0], "g0": batch[1], "g1": batch[2]}
    assert set(got) == set(want)
    for rid, p in want.items():
        assert got[rid]["ok"] and got[rid]["tokens"] == reference(p, 6), got[rid]
        assert not got[rid]["recomputed"]
    # text output: one line per answer, the id then the tokens
    r = generate()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"p0: {' '.join(map(str, reference(batch[0], 6)))} ("), r.stdout
