"""End to end, NACKs: a decode worker whose heartbeats come too seldom for
P's leases (a misconfigured D: interval 2.5 s against P's 1 s extension), so
P's leases lapse while requests wait. P tells D (a NACK for every heartbeat
naming a lapsed lease, and for every transfer-done that arrives after its
lease ended), and D recomputes instead of using what it read: every output
still equals the reference."""

from __future__ import annotations

import pytest
from e2e_workers import Cluster, p_settled, prompts, reference, run_batch, spec, wait_for

pytestmark = pytest.mark.e2e


def test_lapsed_leases_are_nacked_and_recomputed() -> None:
    # --lease-mismatch warn: D would otherwise refuse this P at first contact
    slow_d = ["--kv-lease-duration", "6", "--heartbeat-interval", "2.5", "--lease-mismatch", "warn"]
    with Cluster(
        spec(kv_lease_duration=1.5, max_running=1, d_step_time=0.1, extra={"decode": slow_d})
    ) as cluster:
        batch = prompts(10, seed=40)
        results = run_batch(cluster, batch, "n")
        for i, p in enumerate(batch):
            r = results[f"n{i}"]
            assert r["ok"], r["error"]
            assert r["tokens"] == reference(p), f"n{i} differs from the reference"
        p_stats = p_settled(cluster)[0]
        d_stats = cluster.stats(cluster.decode[0])
        assert p_stats["table"]["released_expired"] >= 1
        assert p_stats["nacks_sent"] >= 1
        assert d_stats["nacks"] >= 1
        assert d_stats["recomputed"] >= 1
        assert sum(r["recomputed"] for r in results.values()) == d_stats["recomputed"]
        # every NACK P sent reached D
        wait_for(
            lambda: cluster.stats(cluster.decode[0])["nacks"] == p_stats["nacks_sent"],
            "D to receive every NACK",
            timeout=10.0,
        )
        # a NACK for an answer D recomputed is not an alarm about that answer
        assert "may be wrong" not in cluster.decode[0].log_path.read_text()
