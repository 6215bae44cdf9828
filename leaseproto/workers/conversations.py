"""What the router keeps per conversation: the decoder that served its last
turn and what that decoder said about the turn's cached blocks (issue 18).

After a turn of conversation ``c`` finishes, D's answer carries ``cache``: its
cached lease id, engine, ranks (agent, address, block ids, layout) and the
lease left as a duration. The next turn of ``c`` whose prompt starts with the
cached tokens goes to P with that ``prefix``, the durations aged by the
router's own clock (the time it held them); a cache is handed out once (the
read ends D's lease: transfer-done, or P's abort). A prompt that does not
extend the cached turn, or a cache whose time is up, gets no prefix (P
prefills the whole prompt; D's lease runs out by itself).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .metrics import RouterMetrics

__all__ = ["Conversations", "prefix_summary"]

#: Most conversations remembered (oldest forgotten first).
MAX_CONVERSATIONS = 10_000


@dataclass
class _Turn:
    tokens: list[int]  # what the cached blocks hold: prompt + output but its last token
    cache: dict[str, Any]
    received: float


class Conversations:
    """Conversation id -> its last turn's cache on D (router clock)."""

    def __init__(
        self, capacity: int = MAX_CONVERSATIONS, metrics: RouterMetrics | None = None
    ) -> None:
        self.metrics = metrics
        self._turns: OrderedDict[str, _Turn] = OrderedDict()
        self.capacity = capacity
        self.counts = {"prefix_sent": 0, "prefix_mismatch": 0, "prefix_expired": 0}

    def _count(self, outcome: str) -> None:
        self.counts[f"prefix_{outcome}"] += 1
        if self.metrics is not None:
            self.metrics.prefixes.labels(outcome=outcome).inc()

    def __len__(self) -> int:
        return len(self._turns)

    def remember(
        self,
        conversation: str,
        prompt: Sequence[int],
        tokens: Sequence[int],
        cache: object,
        *,
        now: float,
    ) -> None:
        """D's answer for a turn: keep where its KV is cached (if D said)."""
        self._turns.pop(conversation, None)
        if not isinstance(cache, dict) or not tokens:
            return
        covered = [*prompt, *tokens[:-1]]
        if cache.get("num_tokens") != len(covered):
            return  # not what this router asked D to keep
        self._turns[conversation] = _Turn(covered, cache, now)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def prefix(self, conversation: str, prompt: Sequence[int], *, now: float) -> dict[str, Any]:
        """The ``prefix``/``cached`` fields of a ``prefill`` for the next turn
        (empty: none), the lease durations aged by the time held here."""
        turn = self._turns.pop(conversation, None)
        if turn is None:
            return {}
        n = len(turn.tokens)
        if len(prompt) <= n or list(prompt[:n]) != turn.tokens:
            self._count("mismatch")
            return {}
        cache = copy.deepcopy(turn.cache)
        held = now - turn.received
        for rank in cache.get("ranks", []):
            rank["lease_remaining"] = float(rank.get("lease_remaining", 0.0)) - held
        if min((r["lease_remaining"] for r in cache.get("ranks", [])), default=0.0) <= 0:
            self._count("expired")
            return {}
        self._count("sent")
        cached = cache.pop("num_tokens")
        return {"prefix": cache, "cached": cached}


def prefix_summary(ranks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the client hears about a turn's prefix: tokens covered, whether
    every P rank used it verified from D, and why any recomputed it."""
    reasons = sorted({str(r["recomputed"]) for r in ranks if r.get("recomputed")})
    return {
        "tokens": ranks[0].get("tokens"),
        "verified": all(bool(r.get("verified")) for r in ranks),
        "recomputed": reasons,
    }
