"""The router's record of conversations: the last turn's cache on D, handed
to the next turn's P once, with its lease durations aged by the router's
clock; a prompt that does not extend the cached turn gets no prefix."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from leaseproto.workers.conversations import Conversations, prefix_summary

CACHE = {
    "remote_req_id": "turn-0123456789abcdef",
    "engine_id": "d",
    "num_tokens": 5,  # prompt [1, 2, 3] + the output's tokens but the last
    "ranks": [{"rank": 0, "agent": "a", "lease_remaining": 10.0}],
}


def test_the_next_turn_gets_the_cache_once_with_its_durations_aged() -> None:
    c = Conversations()
    c.remember("x", [1, 2, 3], [7, 8, 9], CACHE, now=100.0)
    got = c.prefix("x", [1, 2, 3, 7, 8, 9, 4], now=103.5)
    assert got["cached"] == 5
    assert got["prefix"]["ranks"][0]["lease_remaining"] == pytest.approx(6.5)
    assert CACHE["ranks"][0]["lease_remaining"] == 10.0  # D's answer is not changed
    assert c.prefix("x", [1, 2, 3, 7, 8, 9, 4], now=104.0) == {}  # handed out once
    assert c.counts == {"prefix_sent": 1, "prefix_mismatch": 0, "prefix_expired": 0}


@pytest.mark.parametrize(
    ("prompt", "now", "outcome"),
    [
        ([1, 2, 3, 7, 8], 100.0, "prefix_mismatch"),  # nothing new after the cached turn
        ([1, 2, 4, 7, 8, 9, 4], 100.0, "prefix_mismatch"),  # not the cached tokens
        ([1, 2, 3, 7, 8, 9, 4], 110.0, "prefix_expired"),  # D's lease time is up
    ],
)
def test_no_prefix(prompt: list[int], now: float, outcome: str) -> None:
    c = Conversations()
    c.remember("x", [1, 2, 3], [7, 8, 9], CACHE, now=100.0)
    assert c.prefix("x", prompt, now=now) == {}
    assert c.counts[outcome] == 1


def test_a_failed_turn_or_a_foreign_cache_forgets_the_conversation() -> None:
    c = Conversations(capacity=2)
    c.remember("x", [1, 2, 3], [7, 8, 9], CACHE, now=0.0)
    c.remember("x", [1, 2, 3], [], None, now=1.0)  # a failed turn
    assert len(c) == 0
    c.remember("y", [1, 2], [7, 8, 9], CACHE, now=0.0)  # covers 4 tokens, not 5
    assert len(c) == 0
    for conv in "abc":
        c.remember(conv, [1, 2, 3], [7, 8, 9], CACHE, now=0.0)
    assert len(c) == 2  # the oldest is forgotten


def test_prefix_summary() -> None:
    ok = {"tokens": 5, "verified": True, "recomputed": None}
    nk = {"tokens": 5, "verified": False, "recomputed": "nack"}
    assert prefix_summary([ok, ok]) == {"tokens": 5, "verified": True, "recomputed": []}
    assert prefix_summary([ok, nk]) == {"tokens": 5, "verified": False, "recomputed": ["nack"]}
