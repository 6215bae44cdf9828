"""Trace validation of a real run (spec §9.1): the workers of a short run
write traces, the cluster checks them when it stops, and the same traces with
one event changed fail naming the invariant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_workers import Cluster, prompts, run_batch, spec

from leaseproto.checker.trace import check_files
from leaseproto.harness.cluster import TraceViolation

pytestmark = pytest.mark.e2e


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _save(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_real_run_passes_and_its_mutants_fail(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with Cluster(spec(max_running=2, d_step_time=0.03), log_dir=run) as c:
        results = run_batch(c, prompts(6, seed=11), "t")
        assert all(r["ok"] for r in results.values())
    report = c.trace_report
    assert report is not None and report["ok"], report
    assert report["files"] == 2 and report["leases"] == 6 and report["uses"] == 6
    assert report["matched"] > 6 and report["cut"] == 0
    p_path, d_path = run / "prefill-0.trace.jsonl", run / "decode-0.trace.jsonl"
    # every used read's verdict path is measured on the workers' shared clock
    verdicts = report["verdicts"]
    assert verdicts["reads"] == 6 and verdicts["unanswered"] == [], verdicts
    assert all(verdicts[s]["median"] >= 0 for s in ("to_p_poll", "p_answer", "to_d_poll"))

    def mutant(name: str, p: list[dict[str, object]], d: list[dict[str, object]]) -> list[Path]:
        folder = tmp_path / name
        folder.mkdir()
        _save(folder / p_path.name, p)
        _save(folder / d_path.name, d)
        return [folder / p_path.name, folder / d_path.name]

    # P answers NK where it answered OK: the read was handled while the lease was live
    p, d = _lines(p_path), _lines(d_path)
    i = next(i for i, e in enumerate(p) if e["ev"] == "send" and str(e["data"]).startswith("OK:t"))
    p[i]["data"] = "NK:expired:" + str(p[i]["data"])[3:]
    first = check_files(mutant("nk", p, d)).first()
    assert first is not None and first.invariant == "I13", first
    # D's first heartbeat disappears from its trace: P received what nobody sent
    p, d = _lines(p_path), _lines(d_path)
    i = next(i for i, e in enumerate(d) if e["ev"] == "send" and str(e["data"]).startswith("HB:t"))
    del d[i]
    first = check_files(mutant("hb", p, d)).first()
    assert first is not None and first.invariant == "§3.1", first
    # P logs a release of a lease at its grant
    p, d = _lines(p_path), _lines(d_path)
    i = next(i for i, e in enumerate(p) if e["ev"] == "grant")
    grant = p[i]
    p.insert(
        i + 1,
        {
            "ev": "release",
            "t": grant["t"],
            "req": grant["req"],
            "reason": "expired",
            "at": grant["now"],
            "granted_at": grant["now"],
            "deadline": float(str(grant["now"])) + 3.0,
            "last_renewal": None,
            "blocks": 3,
        },
    )
    first = check_files(mutant("early", p, d)).first()
    assert first is not None and first.invariant == "I12", first


def test_a_violation_fails_the_cluster(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(TraceViolation, match="I13"), Cluster(spec(), log_dir=run) as c:
        run_batch(c, prompts(2, seed=12), "v", max_tokens=2)
        c.stop()
        d = run / "decode-0.trace.jsonl"
        rows = [
            r for r in _lines(d) if not (r["ev"] == "recv" and str(r["data"]).startswith("OK:v"))
        ]
        _save(d, rows)
