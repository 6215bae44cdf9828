"""End to end, heterogeneous TP: a 2-rank P with a 1-rank D (D reads half the
heads from each P rank and heartbeats both), and a 1-rank P with a 2-rank D
(each D rank reads its half from the one P rank: two transfer-done
notifications complete that lease)."""

from __future__ import annotations

import pytest
from e2e_workers import Cluster, p_settled, prompts, reference, run_batch, spec

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("p_tp", "d_tp"), [(2, 1), (1, 2)])
def test_heterogeneous_tp_gives_the_reference_tokens(p_tp: int, d_tp: int) -> None:
    # one request at a time with a slow step, so later ones wait for heartbeats
    with Cluster(spec(p_tp=p_tp, d_tp=d_tp, max_running=1, d_step_time=0.05)) as cluster:
        batch = prompts(6, seed=30 + p_tp)
        results = run_batch(cluster, batch, "t")
        for i, p in enumerate(batch):
            r = results[f"t{i}"]
            assert r["ok"], r["error"]
            assert r["tokens"] == reference(p)
            assert not r["recomputed"]
        ranks = p_settled(cluster)
        assert len(ranks) == p_tp
        for s in ranks:  # every P rank freed its own shard on its own lease
            t = s["table"]
            assert t["granted"] == len(batch)
            assert t["released_transferred"] == len(batch)
            assert t["released_expired"] == 0
            assert t["excess_transfers"] == 0
            assert s["heartbeats_received"] > 0  # D heartbeats every P rank
        if d_tp > 1:
            for w in cluster.decode[1:]:
                assert cluster.stats(w)["reads_done"] == len(batch)
