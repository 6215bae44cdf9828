"""End to end, a third NIXL agent that pushed its metadata (issue 17, items 3-5;
spec §10.2): P binds each lease to the decode engine's agents, so such an
agent cannot keep a dead D's blocks, nor complete or abort a live D's leases;
D binds a P agent's name to the address it fetched it from, so a squatter
under P's name neither hangs D nor hears from it; P forgets decoders that
hold no lease and said nothing for ``tombstone_ttl``.

The first two tests hold requests on D (one decodes at a time) past the
initial lease, so their leases live on D's heartbeats alone while the third
agent acts on them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from e2e_workers import (
    EXTENSION,
    LEASE,
    Cluster,
    heartbeat_dead_ds_leases,
    injector,
    live_lease_ids,
    prompts,
    reference,
    run_batch,
    spec,
    submit_until_waiting,
    wait_for,
)

from leaseproto.adapters.nixl import free_port, load_nixl

pytestmark = pytest.mark.e2e

TOKENS = 12


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(max_running=1, d_step_time=0.05)) as c:
        yield c


def test_a_squatter_under_ps_name_neither_hangs_d_nor_hears_from_it(cluster: Cluster) -> None:
    """First in the module: D has not fetched P's metadata yet."""
    p, d = cluster.prefill[0], cluster.decode[0]
    nixl = load_nixl()
    squatter = nixl.nixl_agent(
        p.info["agent"],  # P's agent name, before D ever fetched P's metadata
        nixl.nixl_agent_config(
            enable_listen_thread=True, listen_port=free_port(), backends=["UCX"]
        ),
    )
    squatter.send_local_metadata("127.0.0.1", d.info["nixl_port"])
    time.sleep(0.5)  # D's listener loads it
    batch = prompts(4, seed=91)
    started = time.monotonic()
    results = run_batch(cluster, batch, "sq")
    took = time.monotonic() - started
    for i, pr in enumerate(batch):
        r = results[f"sq{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(pr)
        assert not r["recomputed"]
    assert took < 20.0, f"answers took {took:.1f} s"
    heard = squatter.get_new_notifs()
    assert not any(heard.values()), f"the squatter received {heard}"
    assert cluster.stats(d)["pushes_refused"] >= 1


def test_forged_transfer_dones_and_aborts_for_a_live_d_are_ignored(cluster: Cluster) -> None:
    p = cluster.prefill[0]
    agent = p.info["agent"]
    before = cluster.stats(p)
    with injector(cluster, "forger") as ep:
        client = cluster.client()
        try:
            batch = submit_until_waiting(client, cluster, "td", 8, TOKENS)
            live = live_lease_ids(cluster)
            assert len(live) >= 3, live
            for rid in live:  # D heartbeated each of them: bound to D's agents
                assert ep.send(agent, f"{rid}:1".encode())
                assert ep.send(agent, f"AB:{rid}".encode())
            results = client.wait_all(deadline=time.monotonic() + 60.0)
        finally:
            client.close()
    for i, pr in enumerate(batch):
        r = results[f"td{i}"]
        assert r["ok"], r["error"]
        assert r["tokens"] == reference(pr, TOKENS)
        assert not r["recomputed"], f"td{i}: its lease was ended by the forger, the read got NK"
    after = wait_for(
        lambda: s if (s := cluster.stats(p))["leases_live"] == 0 else None,
        "P to hold no lease",
        timeout=LEASE + EXTENSION + 5,
    )
    refused = {k: n - before["acts_refused"][k] for k, n in after["acts_refused"].items()}
    assert refused["transfer_done"] >= len(live) and refused["abort"] >= len(live), refused
    t0, t1 = before["table"], after["table"]
    assert t1["released_transferred"] - t0["released_transferred"] == len(batch)
    assert t1["released_aborted"] == t0["released_aborted"]
    assert t1["late_transfers"] == t0["late_transfers"]
    assert "act for a lease bound to other agents" in p.log_tail(400)


def test_a_third_agent_cannot_keep_a_dead_ds_blocks(cluster: Cluster) -> None:
    """Last in the module: it kills D."""
    p = cluster.prefill[0]
    agent = p.info["agent"]
    with injector(cluster, "keeper") as ep:
        before = cluster.stats(p)
        client = cluster.client()
        try:
            submit_until_waiting(client, cluster, "dd", 6, TOKENS)
            killed = cluster.kill(cluster.decode[0])
        finally:
            client.close()
        # freed within E + H of D's death (its last heartbeat)
        live, freed = heartbeat_dead_ds_leases(cluster, lambda hb: ep.send(agent, hb), killed)
    assert freed is not None, (
        f"a third agent's heartbeats kept a dead D's blocks {time.monotonic() - killed:.1f} s"
    )
    after = cluster.stats(p)
    assert after["acts_refused"]["heartbeat"] - before["acts_refused"]["heartbeat"] >= len(live)
    assert after["blocks_free"] == after["blocks_total"]


def test_p_forgets_silent_decoders_and_serves_them_again() -> None:
    ttl = 1.0  # P waits at least two lease extensions
    forget_after = max(ttl, 2 * EXTENSION)
    s = spec(max_running=2, extra={"prefill": ["--tombstone-ttl", str(ttl)]})
    with Cluster(s) as cluster:
        p = cluster.prefill[0]
        for r in run_batch(cluster, prompts(3, seed=17), "a").values():
            assert r["ok"], r["error"]
        assert cluster.stats(p)["agents_heard"] >= 1
        stats = wait_for(
            lambda: st if (st := cluster.stats(p))["agents_forgotten"] >= 1 else None,
            "P to forget the silent decoder",
            timeout=LEASE + EXTENSION + forget_after + 5.0,
        )
        assert stats["agents_heard"] == 0 and stats["verdict_readers"] == 0
        assert f"forgot 1 decoder agent (no live lease, silent for {forget_after:g} s)" in (
            p.log_tail(200)
        )
        # the decoder comes back: it pushes its metadata again and is served as before
        again = prompts(3, seed=secrets.randbelow(1000))
        results = run_batch(cluster, again, "b")
        for i, pr in enumerate(again):
            r = results[f"b{i}"]
            assert r["ok"], r["error"]
            assert r["tokens"] == reference(pr)
            assert not r["recomputed"], f"b{i}: P no longer knew the decoder"
        back = cluster.stats(p)
        assert back["verdict_readers"] == 1 and back["unknown_sender"] == 0
