"""End to end: P at a 3 s lease, D at 30 s (heartbeats every 5 s against P's
2 s extension). D checks P's advertised settings at first contact and refuses
its requests, naming both values, or (``--lease-mismatch warn``) says so
loudly once and serves them."""

from __future__ import annotations

import pytest
from e2e_workers import Cluster, prompts, run_batch, spec

pytestmark = pytest.mark.e2e

D_AT_30 = ["--kv-lease-duration", "30"]


def test_d_refuses_a_p_whose_leases_it_cannot_keep() -> None:
    with Cluster(spec(kv_lease_duration=3.0, extra={"decode": D_AT_30})) as cluster:
        results = run_batch(cluster, prompts(2, seed=70), "m")
        for r in results.values():
            assert not r["ok"]
            assert "heartbeat_interval 5 s" in r["error"] and "lease_extension 2 s" in r["error"]
        log = cluster.decode[0].log_tail(200)
        assert log.count("do not fit ours") == 1, log
        assert "refusing its requests" in log


def test_warn_serves_and_says_so_once() -> None:
    d = [*D_AT_30, "--lease-mismatch", "warn"]
    with Cluster(spec(kv_lease_duration=3.0, extra={"decode": d})) as cluster:
        results = run_batch(cluster, prompts(2, seed=71), "w")
        assert all(r["ok"] for r in results.values()), results
        log = cluster.decode[0].log_tail(400)
        assert log.count("do not fit ours") == 1, log
        assert "serving it anyway" in log
