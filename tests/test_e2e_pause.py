"""End to end, the key safety schedule of verified reads (I13): D paused
(SIGSTOP) past the leases of requests it has not yet seen, while new requests
reuse the blocks P freed; just before D resumes, P's loop stalls (SIGSTOP for
about a second, plus 1 MiB heartbeats from a third NIXL agent), so a NACK
could not win a race against D's answer. D must answer no token computed
from freed blocks: every paused request is recomputed, every answer equals
the single-process reference.

Once the issue's recipe (3 s lease, 6 s pause) gave 6 wrong answers of 32 in
4 of 4 runs. Here the same schedule runs :data:`REPS` times in one cluster on
a 2 s lease (heartbeat 0.33 s, extension 1.33 s) with a 4 s pause: still
twice the lease plus more than an extension, so every paused request's lease
has ended before D resumes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest
from e2e_workers import Cluster, pause_past_leases, prompts, reference, spec, wait_for

from leaseproto.adapters.nixl import NixlEndpoint, free_port

pytestmark = pytest.mark.e2e

LEASE = 2.0
PAUSE = 4.0
P_STALL = 1.0
REPS = 20
PAUSED, REUSERS, TOKENS = 4, 4, 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(kv_lease_duration=LEASE, max_running=2, d_step_time=0.02)) as c:
        yield c


def _pause_with_busy_p(cluster: Cluster, rep: int, flood: NixlEndpoint) -> dict[str, int]:
    p_agent = cluster.prefill[0].info["agent"]
    paused = prompts(PAUSED, seed=1000 + rep, length=12)
    reusers = prompts(REUSERS, seed=2000 + rep, length=12)
    client = cluster.client()

    def stalled() -> None:  # (large heartbeats once stalled P too; now capped)
        for _ in range(2):
            flood.send(p_agent, b"HB:" + b"x" * (1 << 20))

    try:
        # P grants the first batch; D, stopped, never heartbeats them: the
        # leases end and P frees their blocks, which the next prompts get
        pause_past_leases(
            cluster,
            client,
            rep,
            (paused, reusers),
            lease=LEASE,
            pause=PAUSE,
            p_stall=P_STALL,
            tokens=TOKENS,
            stalled=stalled,
        )
        results = client.wait_all(deadline=time.monotonic() + 60.0)
    finally:
        client.close()
    wrong = recomputed_paused = 0
    for tag, batch in (("a", paused), ("b", reusers)):
        for i, pr in enumerate(batch):
            r = results.get(f"{tag}{rep}-{i}")
            assert r is not None, f"rep {rep}: no answer for {tag}{i}"
            assert r["ok"], f"rep {rep}: {r['error']}"
            if r["tokens"] != reference(pr, TOKENS):
                wrong += 1
            if tag == "a" and r["recomputed"]:
                recomputed_paused += 1
    return {"wrong": wrong, "recomputed_paused": recomputed_paused}


def test_pause_with_busy_p_never_answers_from_freed_blocks(cluster: Cluster) -> None:
    p = cluster.prefill[0].info
    flood = NixlEndpoint(
        f"stall-{secrets.token_hex(3)}", port=free_port(), progress_thread=True
    )  # it runs no loop: NIXL progresses its sends
    try:
        flood.connect(p["agent"], "127.0.0.1", p["nixl_port"])
        wait_for(lambda: flood.is_connected(p["agent"]), "the third agent's handshake")
        p0 = cluster.stats(cluster.prefill[0])
        totals = {"wrong": 0, "recomputed_paused": 0}
        for rep in range(REPS):
            got = _pause_with_busy_p(cluster, rep, flood)
            for k in totals:
                totals[k] += got[k]
            assert got["wrong"] == 0, f"rep {rep}: {got['wrong']} answers from freed blocks"
    finally:
        flood.close()
    assert totals["wrong"] == 0
    # every paused request's lease ended before D saw it: each one was recomputed
    assert totals["recomputed_paused"] == REPS * PAUSED, totals
    p1 = cluster.stats(cluster.prefill[0])
    assert p1["table"]["released_expired"] - p0["table"]["released_expired"] >= REPS * PAUSED
    d = cluster.stats(cluster.decode[0])
    assert d["nack_after_answer"] == 0
    # and D never calls an answer it recomputed "possibly wrong"
    assert "may be wrong" not in cluster.decode[0].log_path.read_text()
