"""The interleaving of ``benchmarks/vllm_pd.py --latency`` (``benchmarks/_vllm_latency.py``):
ABBA order, warm-up left out, and with ``focus`` each request made with only its pair
running. No vLLM needed: the servers are a function."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _vllm_latency import d_leg_rounds  # noqa: E402

PAIRS = {"stock": (1, 2), "ours": (3, 4)}
NAMES = {1: "stock", 2: "stock", 3: "ours", 4: "ours"}


def _rounds(focus: Any = None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    log: list[tuple[str, str]] = []
    running = {"stock", "ours"}

    def post(port: int, body: dict[str, Any]) -> dict[str, Any]:
        name = NAMES[port]
        assert name in running, f"a request to {name} while it was stopped"
        log.append((name, "P" if port % 2 else "D"))
        return {"kv_transfer_params": {}, "choices": [{"text": name}]}

    def track(name: str | None) -> None:
        running.clear()
        running.update(PAIRS if name is None else {name})
        log.append(("focus", str(name)))

    res = d_leg_rounds(
        post, PAIRS, [f"p{i}" for i in range(6)], warmup=2, focus=track if focus else None
    )
    return res, log


def test_the_pairs_alternate_abba_and_the_warm_up_is_left_out() -> None:
    res, log = _rounds()
    order = [name for name, side in log if side == "D"]
    abba = ["stock", "ours", "stock", "ours", "ours", "stock", "ours", "stock"]
    assert order == abba + abba[:4]  # 6 prompts, two pairs each
    assert {n: len(v) for n, v in res["d_leg_s"].items()} == {"stock": 4, "ours": 4}
    assert res["tokens"] == {"stock": ["stock"] * 4, "ours": ["ours"] * 4}


def test_with_focus_each_request_runs_with_its_pair_alone_and_all_run_at_the_end() -> None:
    _, log = _rounds(focus=True)
    for i, (name, _) in enumerate(log):
        if name == "focus":
            continue
        last_focus = next(f for f in reversed(log[:i]) if f[0] == "focus")
        assert last_focus[1] == name, (i, log)
    assert log[-1] == ("focus", "None")
    assert sum(1 for n, _ in log if n == "focus") == 12 + 1
