"""Shared helpers of the worker end-to-end tests (``tests/test_e2e_*.py``).

Every test starts real ``leaseproto serve`` processes on loopback through
:class:`leaseproto.workers.cluster.Cluster`; workers bind port 0 and report
their ports, so concurrent runs never collide. Waits poll against deadlines.

Timescale: ``kv_lease_duration`` 3 s, so heartbeats every 0.5 s and a lease
extension of 2 s: loose enough for a loaded two-core machine (T2 leaves 1.5 s
for a D step, a notification and a P step), short enough to keep the tests
fast.
"""

from __future__ import annotations

import importlib
import random
import time
from typing import Any

import pytest

for _mod in ("torch", "zmq", "msgpack", "prometheus_client"):
    pytest.importorskip(_mod)
try:
    importlib.import_module("leaseproto.adapters.nixl").load_nixl()
except ImportError as exc:  # pragma: no cover - CI installs NIXL
    pytest.skip(f"NIXL is not importable: {exc}", allow_module_level=True)

from polling import wait_for  # noqa: E402

from leaseproto import LeaseConfig  # noqa: E402
from leaseproto.workers.backend import reference_tokens  # noqa: E402
from leaseproto.workers.cluster import Cluster, ClusterSpec  # noqa: E402

__all__ = ["LEASE", "Cluster", "ClusterSpec", "prompts", "reference", "spec", "wait_for"]

LEASE = 3.0
HEARTBEAT = LeaseConfig(LEASE).heartbeat_interval
EXTENSION = LeaseConfig(LEASE).lease_extension
MAX_TOKENS = 8
#: generous: requests queue behind each other on purpose
ANSWER_S = 60.0


def spec(**kw: Any) -> ClusterSpec:
    base: dict[str, Any] = {
        "kv_lease_duration": LEASE,
        "max_running": 2,
        "d_step_time": 0.03,
        "p_blocks": 128,
        "d_blocks": 128,
    }
    base.update(kw)
    return ClusterSpec(**base)


def prompts(n: int, seed: int, length: int = 10) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(length)] for _ in range(n)]


def reference(prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    return reference_tokens(prompt, max_tokens)


def run_batch(
    cluster: Cluster, batch: list[list[int]], tag: str, max_tokens: int = MAX_TOKENS
) -> dict[str, dict[str, Any]]:
    """Submit ``batch`` at once; every answer, keyed ``<tag><i>``."""
    client = cluster.client()
    try:
        for i, p in enumerate(batch):
            client.submit(f"{tag}{i}", p, max_tokens)
        results = client.wait_all(deadline=time.monotonic() + ANSWER_S)
    finally:
        client.close()
    missing = sorted(set(f"{tag}{i}" for i in range(len(batch))) - set(results))
    assert not missing, f"no answer within {ANSWER_S:g} s for {missing}"
    return results


def p_settled(cluster: Cluster) -> list[dict[str, Any]]:
    """Wait until every P rank holds no lease and no block; their stats."""

    def check() -> list[dict[str, Any]] | None:
        stats = [cluster.stats(w) for w in cluster.prefill]
        if all(s["leases_live"] == 0 and s["blocks_free"] == s["blocks_total"] for s in stats):
            return stats
        return None

    # at most one initial lease plus one extension after the last transfer
    settled: list[dict[str, Any]] = wait_for(
        check, "every P block free", timeout=LEASE + EXTENSION + 5.0
    )
    return settled
