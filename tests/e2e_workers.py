"""Shared helpers of the worker end-to-end tests (``tests/test_e2e_*.py``).

Every test starts real ``leaseproto serve`` processes on loopback through
:class:`leaseproto.harness.cluster.Cluster`; workers bind port 0 and report
their ports, so concurrent runs never collide. Waits poll against deadlines.

Timescale: ``kv_lease_duration`` 3 s, so heartbeats every 0.5 s and a lease
extension of 2 s: loose enough for a loaded two-core machine (T2 leaves 1.5 s
for a D step, a notification and a P step), short enough to keep the tests
fast.
"""

from __future__ import annotations

import importlib
import random
import re
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

for _mod in ("torch", "zmq", "msgspec", "prometheus_client"):
    pytest.importorskip(_mod)
try:
    importlib.import_module("leaseproto.adapters.nixl").load_nixl()
except ImportError as exc:  # pragma: no cover - CI installs NIXL
    pytest.skip(f"NIXL is not importable: {exc}", allow_module_level=True)

from polling import wait_for  # noqa: E402

from leaseproto import LeaseConfig  # noqa: E402
from leaseproto.adapters.nixl import NixlEndpoint, free_port  # noqa: E402
from leaseproto.harness.cluster import Cluster, ClusterSpec  # noqa: E402
from leaseproto.workers.backend import reference_tokens  # noqa: E402

__all__ = [
    "LEASE",
    "Cluster",
    "ClusterSpec",
    "heartbeat_dead_ds_leases",
    "injector",
    "live_lease_ids",
    "pause_past_leases",
    "prompts",
    "reference",
    "spec",
    "submit_until_waiting",
    "wait_for",
]

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


@contextmanager
def injector(cluster: Cluster, tag: str = "inject") -> Iterator[NixlEndpoint]:
    """A third NIXL agent that exchanged metadata with P rank 0 (fetched P's,
    pushed its own: a known peer to P), once P admits its notifications."""
    p = cluster.prefill[0].info
    # it runs no loop: NIXL's progress thread moves its sends
    ep = NixlEndpoint(f"{tag}-{secrets.token_hex(3)}", port=free_port(), progress_thread=True)
    try:
        ep.connect(p["agent"], "127.0.0.1", p["nixl_port"])
        wait_for(lambda: ep.is_connected(p["agent"]), "the injector's handshake")
        until_p_admits(cluster, ep)
        yield ep
    finally:
        ep.close()


def until_p_admits(cluster: Cluster, ep: NixlEndpoint, timeout: float = 30.0) -> None:
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


def live_lease_ids(cluster: Cluster) -> list[str]:
    """The ids of P rank 0's live leases, from its log."""
    text = cluster.prefill[0].log_path.read_text()
    granted = set(re.findall(r"granted req (\S+) a ", text))
    released = set(re.findall(r"released \d+ blocks of req (\S+):", text))
    return sorted(granted - released)


def heartbeat_dead_ds_leases(
    cluster: Cluster, send: Callable[[bytes], object], killed: float, *, grace: float = 0.0
) -> tuple[list[str], float | None]:
    """Forge heartbeats (``send(payload)``, every 0.2 s) naming P rank 0's live
    leases after D was killed at ``killed``, until P holds none or E + H (+2 s
    for P's loop and this poll, + ``grace``) have passed since; the ids and when
    P held none (None: it still held some)."""
    live = live_lease_ids(cluster)
    assert live, "no live lease to keep"
    payload = ("HB:" + ",".join(live)).encode()
    deadline = killed + EXTENSION + HEARTBEAT + 2.0 + grace
    while time.monotonic() < deadline:
        send(payload)
        if cluster.stats(cluster.prefill[0])["leases_live"] == 0:
            return live, time.monotonic()
        time.sleep(0.2)
    return live, None


def submit_until_waiting(client: Any, cluster: Cluster, tag: str, n: int, tokens: int) -> Any:
    """Submit ``n`` prompts as ``<tag><i>`` and wait until at least three wait
    on D under live leases (the tests' D decodes one at a time); the prompts."""
    batch = prompts(n, seed=hash(tag) % 1000)
    for i, p in enumerate(batch):
        client.submit(f"{tag}{i}", p, tokens)
    wait_for(
        lambda: (
            cluster.stats(cluster.decode[0])["waiting"] >= 3
            and cluster.stats(cluster.prefill[0])["leases_live"] >= 3
        ),
        "requests waiting on D under live leases",
    )
    return batch


def pause_past_leases(
    cluster: Cluster,
    client: Any,
    rep: int,
    batches: tuple[list[list[int]], list[list[int]]],
    *,
    lease: float,
    pause: float,
    p_stall: float,
    tokens: int,
    reuse_after: float = 0.5,
    behind: Callable[[], None] = lambda: None,
    stalled: Callable[[], None] = lambda: None,
) -> None:
    """The pause schedule of verified reads: D stopped (SIGSTOP) for
    ``pause`` s while the first batch (``a<rep>-<i>``) is submitted and its
    leases end unrenewed, then the second (``b<rep>-<i>``, ``lease +
    reuse_after`` s in) gets the blocks P freed; ``behind()`` runs once they
    are queued for D, ``stalled()`` once P is stopped too, for ``p_stall`` s
    around D's resume (so a NACK could not win a race against D's answer)."""
    d, p = cluster.decode[0], cluster.prefill[0]
    paused, reusers = batches
    d.proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        for i, pr in enumerate(paused):
            client.submit(f"a{rep}-{i}", pr, tokens)
        time.sleep(lease + reuse_after)
        for i, pr in enumerate(reusers):
            client.submit(f"b{rep}-{i}", pr, tokens)
        behind()
        time.sleep(max(0.0, t0 + pause - p_stall / 2 - time.monotonic()))
        p.proc.send_signal(signal.SIGSTOP)  # P's loop stalls ...
        try:
            stalled()
            time.sleep(p_stall / 2)
        finally:
            d.proc.send_signal(signal.SIGCONT)  # ... as D resumes and reads
        time.sleep(p_stall / 2)
    finally:
        p.proc.send_signal(signal.SIGCONT)
        d.proc.send_signal(signal.SIGCONT)
