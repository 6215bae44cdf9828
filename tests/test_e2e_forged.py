"""End to end, the pause schedule of :mod:`test_e2e_pause` with forged
``decode`` messages (issue 17, item 1): while D is paused past the leases of
requests it has not yet seen and P reuses their blocks, a client of D's
request plane sends D copies of P's transfer parameters without P's
``leaseproto`` advert:

* **plain**: P's one rank, the advert dropped (a read of a lease the
  attacker prefilled itself and let expire);
* **doubled** (:data:`DOUBLED` of them): P's agent named as both ranks of a
  two-rank engine, so every agent it names is connected. Before issue 17 this replaced D's record of
  P's engine with one that gives no verdicts, and the legitimate requests
  waiting behind it were read and used unverified: answers computed from
  blocks P had freed and given to other prompts.

D must answer no token computed from freed blocks (every answer equals the
single-process reference), use no read unverified, refuse each doubled
message with a clear error, and the workers' traces must pass
``check-trace`` (the cluster checks them when it stops; an I13 violation
raises there).

Timescale: a 1.2 s lease (heartbeat 0.2 s, extension 0.8 s), a 2.1 s pause
of D; :data:`REPS` runs in one cluster (about 3 s each).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from e2e_workers import Cluster, pause_past_leases, prompts, reference, run_batch, spec

from leaseproto.workers.plane import Peer, call

pytestmark = pytest.mark.e2e

LEASE = 1.2
#: the paused requests' leases have ended (granted at once, never renewed)
#: before their blocks go to the reusers at LEASE + 0.4
PAUSE = LEASE + 0.9
P_STALL = 0.6
REPS = 10
PAUSED, REUSERS, TOKENS = 3, 3, 4
#: doubled forgeries per run: D's request plane serves its peers round-robin,
#: so several make one the last message D takes before it schedules reads
DOUBLED = 10


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(spec(kv_lease_duration=LEASE, max_running=2, d_step_time=0.02)) as c:
        yield c


def _forgeries(
    cluster: Cluster, rep: int
) -> tuple[list[int], dict[str, Any], list[dict[str, Any]]]:
    """Decode messages built from a prefill asked of P directly, the advert
    dropped: the prompt, the plain forgery, the doubled ones."""
    prompt = prompts(1, seed=3000 + rep, length=12)[0]
    rid = f"x{rep}-{secrets.token_hex(8)}"
    got = call(
        cluster.prefill[0].address, {"op": "prefill", "req_id": rid, "prompt": prompt}, timeout=10
    )
    assert got["op"] == "prefilled" and "leaseproto" in got, got
    rank = {k: v for k, v in got.items() if k not in ("op", "leaseproto", "req_id")}

    def msg(ranks: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "op": "decode",
            "req_id": f"forged-{secrets.token_hex(6)}",
            "prompt": prompt,
            "max_tokens": TOKENS,
            "params": {"remote_req_id": rid, "engine_id": got["engine_id"], "ranks": ranks},
        }

    doubled = [{**rank, "rank": i, "tp": 2} for i in range(2)]
    return prompt, msg([rank]), [msg(doubled) for _ in range(DOUBLED)]


def _pause_with_forgeries(cluster: Cluster, rep: int, attacker: Peer) -> dict[str, int]:
    paused = prompts(PAUSED, seed=1000 + rep, length=12)
    reusers = prompts(REUSERS, seed=2000 + rep, length=12)
    plain_prompt, plain, doubled = _forgeries(cluster, rep)
    forged = [plain, *doubled]
    client = cluster.client()
    answers: dict[str, dict[str, Any]] = {}

    def behind() -> None:  # the forgeries, behind the legitimate requests in D's queue
        time.sleep(0.15)  # the router has passed those on
        for m in forged:
            assert attacker.send(m)

    try:
        pause_past_leases(
            cluster,
            client,
            rep,
            (paused, reusers),
            lease=LEASE,
            pause=PAUSE,
            p_stall=P_STALL,
            tokens=TOKENS,
            reuse_after=0.4,
            behind=behind,
        )
        results = client.wait_all(deadline=time.monotonic() + 60.0)
        deadline = time.monotonic() + 60.0
        while len(answers) < len(forged) and time.monotonic() < deadline:
            if attacker.sock.poll(100, zmq.POLLIN) and (got := attacker.recv()) is not None:
                answers[str(got.get("req_id"))] = got
    finally:
        client.close()
    wrong = 0
    for tag, batch in (("a", paused), ("b", reusers)):
        for i, pr in enumerate(batch):
            r = results.get(f"{tag}{rep}-{i}")
            assert r is not None, f"rep {rep}: no answer for {tag}{i}"
            assert r["ok"], f"rep {rep}: {r['error']}"
            wrong += r["tokens"] != reference(pr, TOKENS)
    got = answers.get(plain["req_id"])
    assert got is not None, f"rep {rep}: no answer to the plain forgery"
    if got["ok"]:  # verified: P said NK (its lease had expired), so recomputed
        wrong += got["tokens"] != reference(plain_prompt, TOKENS)
        assert got["recomputed"], f"rep {rep}: a read of an expired lease was used"
    for m in doubled:
        got = answers.get(m["req_id"])
        assert got is not None, f"rep {rep}: no answer to a doubled forgery"
        assert not got["ok"] and "greeted" in got["error"], got
    return {"wrong": wrong}


def test_forged_decode_messages_never_turn_verification_off(cluster: Cluster) -> None:
    d = cluster.decode[0]
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    attacker = Peer(ctx, d.address)
    # a running cluster: P has greeted D (a forgery before that is verified
    # too, tests/test_decode_verify.py, but is not refused)
    warm = run_batch(cluster, prompts(1, seed=999), "warm", TOKENS)
    assert warm["warm0"]["ok"], warm
    before = cluster.stats(d)
    try:
        wrong = 0
        for rep in range(REPS):
            wrong += _pause_with_forgeries(cluster, rep, attacker)["wrong"]
        assert wrong == 0, f"{wrong} answers computed from freed blocks"
    finally:
        attacker.close()
        ctx.term()
    after = cluster.stats(d)
    assert after["unverified_reads"] == 0, after
    assert after["verified_reads"] > before["verified_reads"]
    refused = after["contradicting_requests"] - before["contradicting_requests"]
    assert refused == REPS * DOUBLED
    assert "may be wrong" not in d.log_path.read_text()
