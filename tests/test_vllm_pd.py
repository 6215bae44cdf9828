"""Real vLLM P/D engines (benchmarks/vllm_pd.py) with LeaseprotoConnector on both sides:
every completion through a surge and a D stall past the lease extension equals the
single-instance run, and after a D SIGKILL P frees within its bound.

Minutes of CPU: runs only with ``LEASEPROTO_VLLM_E2E=1`` (``.ci/run`` sets it when the
whole CI run has time left, and says so when it has not)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.vllm_e2e,
    pytest.mark.skipif(
        os.environ.get("LEASEPROTO_VLLM_E2E") != "1",
        reason="vllm_e2e: real vLLM engines take about 10 min; set LEASEPROTO_VLLM_E2E=1 "
        "(.ci/run does when time allows)",
    ),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]


def test_leaseproto_pair_serves_no_completion_from_freed_blocks(tmp_path: Path) -> None:
    out = tmp_path / "pd.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "vllm_pd.py"),
            "--pairs",
            "leaseproto",
            "--requests",
            "6",
            "--max-tokens",
            "150",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["leaseproto"]
    assert rows["reference_distinct"] > 1  # the random model's outputs depend on the prompt
    for phase in ("surge", "stall"):
        row = rows[phase]
        assert row["completed"] == row["requests"], (phase, row)
        assert row["identical"] == row["completed"], (phase, row)
    import torch

    if torch.cpu._is_amx_tile_supported():  # before any forward (integrations/vllm/amx.py)
        for side in ("P", "D"):
            log = (tmp_path / f"leaseproto-{side}.log").read_text()
            assert "AMX tiles granted" in log, side
    kill = rows["kill"]
    # On a quiet machine every read of the kill phase can be done before the kill, so P
    # holds no lease of the dead D and frees nothing after it (no time to measure); the bound
    # is checked whenever P did free blocks of the killed D.
    if kill["kill_to_last_free_s"] is not None:
        assert kill["kill_to_last_free_s"] <= kill["bound_s"] + 3.0  # polling and step slack
