"""A real two-turn exchange for ``benchmarks/vllm_pd.py --two-turn`` (vLLM's
bidirectional mode, ``bidirectional_kv_xfer``), routed as vLLM's toy proxy does:

1. turn 1: prefill on P (``do_remote_decode``), decode on D with P's transfer
   parameters; D keeps the finished turn's KV blocks (for ``decoder_kv_blocks_ttl``)
   and returns their transfer parameters;
2. turn 2: the conversation so far plus a new user turn goes to P with D's
   parameters, so P READs the cached prefix from D and prefills only the rest; D
   decodes with P's parameters as in turn 1.

Prompts travel as token ids (``return_token_ids``), so turn 2's prefix is exactly
the tokens D holds. Each turn is compared with the same tokens served whole by one
instance (P, no transfer parameters)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["tokens", "two_turn_table", "two_turns"]

Post = Callable[[int, dict[str, Any]], dict[str, Any]]


def tokens(port: int, text: str) -> list[int]:
    """``text`` as the server's tokenizer encodes it (vLLM's ``/tokenize``)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/tokenize",
        data=json.dumps({"model": "m", "prompt": text, "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return [int(t) for t in json.loads(r.read())["tokens"]]


def _ids(out: dict[str, Any]) -> tuple[list[int], list[int]]:
    choice = out["choices"][0]
    return list(out.get("prompt_token_ids") or choice["prompt_token_ids"]), list(
        choice["token_ids"]
    )


def _complete(
    post: Post, port: int, ids: list[int], max_tokens: int, params: dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    if params is not None:
        body["kv_transfer_params"] = params
    return post(port, body)


def _first_diff(got: list[int], ref: list[int]) -> int | None:
    """The first position where ``got`` and ``ref`` differ (None when equal)."""
    if got == ref:
        return None
    pairs = enumerate(zip(got, ref, strict=False))  # a shorter answer parts where it ends
    return next((i for i, (a, b) in pairs if a != b), min(len(got), len(ref)))


def two_turns(
    post: Post,
    *,
    p_port: int,
    d_port: int,
    turn1: list[int],
    turn2: list[int],
    max_tokens: int,
) -> dict[str, Any]:
    """One conversation through P and D and through P alone; what each turn gave."""
    ref1 = _ids(_complete(post, p_port, turn1, max_tokens, None))[1]
    ref2 = _ids(_complete(post, p_port, turn1 + ref1 + turn2, max_tokens, None))[1]
    first = _complete(post, p_port, turn1, 1, {"do_remote_decode": True})
    out1 = _complete(post, d_port, turn1, max_tokens, first["kv_transfer_params"])
    got1 = _ids(out1)[1]
    cached = out1.get("kv_transfer_params")  # D's blocks of turn 1, for P to read
    prompt2 = turn1 + got1 + turn2
    second = _complete(post, p_port, prompt2, 1, cached or {"do_remote_decode": True})
    out2 = _complete(post, d_port, prompt2, max_tokens, second["kv_transfer_params"])
    got2 = _ids(out2)[1]
    return {
        "turn1_identical": got1 == ref1,
        "turn2_identical": got2 == ref2,
        # where the answers part (None: identical), and what each gave, to compare pairs
        "turn1_first_diff": _first_diff(got1, ref1),
        "turn2_first_diff": _first_diff(got2, ref2),
        "turn2_tokens": got2,
        "turn2_reference": ref2,
        # D kept turn 1's blocks and told the router where they are (bidirectional mode)
        "d_returned_blocks": bool(cached and cached.get("remote_block_ids")),
        "d_cached_tokens": None if not cached else cached.get("remote_num_tokens"),
    }


def two_turn_table(turns: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """One row per pair: what the conversations gave, and what P and D counted."""

    def total(rows: list[dict[str, Any]], side: str, *names: str) -> int:
        return int(sum(r[f"{side}_counters"].get(n, 0.0) for r in rows for n in names))

    header = (
        "pair",
        "conversations",
        "turn 1 identical",
        "turn 2 identical",
        "D kept turn 1",
        "P: turn-2 reads verified",
        "P: reads refused/timed out",
        "P: expired leases",
        "P: late reads",
        "trace validation",
    )
    out = []
    for name, res in turns.items():
        failed = [r for r in res["conversations"] if "failed" in r]
        rows = [r for r in res["conversations"] if "failed" not in r]
        t = res.get("trace")
        stalls = sum(len(r.get("stalls", ())) for r in res["conversations"])
        out.append(
            (
                name,
                f"{len(rows)}"
                + (f" (+{len(failed)} failed)" if failed else "")
                + (f", {stalls} stalled" if stalls else ""),
                f"{sum(r['turn1_identical'] for r in rows)}/{len(rows)}",
                f"{sum(r['turn2_identical'] for r in rows)}/{len(rows)}",
                f"{sum(r['d_returned_blocks'] for r in rows)}/{len(rows)}",
                total(rows, "p", "vllm:leaseproto_reads_verified"),
                total(
                    rows,
                    "p",
                    "vllm:leaseproto_reads_refused",
                    "vllm:leaseproto_reads_verdict_timeout",
                ),
                total(rows, "p", "vllm:nixl_num_kv_expired_reqs"),
                total(rows, "p", "vllm:nixl_num_notifications_after_expiry"),
                "-" if t is None else f"{t['events']} events, {t['violations']} violations",
            )
        )
    return header, out
