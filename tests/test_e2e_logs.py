"""End to end, what a person running the workers by hand reads in their logs:
where each worker serves metrics, and at DEBUG a line per renewal (P) and per
heartbeat (D), so one request's lease history is in the logs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from e2e_workers import Cluster, prompts, run_batch, spec

pytestmark = pytest.mark.e2e


def test_debug_logs_show_renewals_and_metrics_ports() -> None:
    with Cluster(spec(max_running=1, d_step_time=0.1, log_level="DEBUG")) as cluster:
        results = run_batch(cluster, prompts(3, seed=80), "g")
        assert all(r["ok"] for r in results.values())
        p_log = cluster.prefill[0].log_tail(5000)
        d_log = cluster.decode[0].log_tail(5000)
        # the last request waited behind two others: P renewed its lease, and said so
        req = results["g2"]["req_id"]
        assert re.search(rf"renewed req {re.escape(req)}: lease ends in \d+\.\d\d s", p_log)
        assert re.search(rf"heartbeat to P engine \S+ \(1 rank\) naming \d+ reqs?: .*{req}", d_log)
        for w in cluster.workers():
            port = w.info["metrics_port"]
            assert f"metrics on http://127.0.0.1:{port}/metrics" in w.log_tail(5000), w.name
            # without --cluster-key-file each worker says so, once, at start-up
            assert w.log_tail(5000).count("control plane UNAUTHENTICATED") == 1, w.name
        # and `leaseproto trace` puts that history together from the three logs
        logs = [str(w.log_path) for w in cluster.workers()]
        r = subprocess.run(
            [sys.executable, "-m", "leaseproto", "trace", req, *logs],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()

        def first(text: str) -> int:
            return next(i for i, ln in enumerate(lines) if text in ln)

        assert first("granted req") < first("renewed req") < first("released")
