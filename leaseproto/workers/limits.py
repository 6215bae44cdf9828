"""What a request must fit, checked by the router at intake against the
limits each worker reported in its ``pong`` (positions, blocks): a request no
worker could ever schedule is refused now rather than at the request timeout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["never_fits"]


def never_fits(
    workers: Sequence[tuple[str, dict[str, Any]]], prompt_len: int, max_tokens: int
) -> str | None:
    """Why no worker of ``workers`` (name, ``pong``) could ever schedule a
    ``prompt_len``-token prompt with ``max_tokens`` new tokens, or None."""
    for name, info in workers:
        limits = info.get("limits")
        if not isinstance(limits, dict):
            continue  # a worker that does not say: it refuses at its own intake
        positions, blocks, size = (
            limits.get(k) for k in ("max_positions", "num_blocks", "block_size")
        )
        if isinstance(positions, int) and prompt_len + max_tokens > positions:
            return f"{prompt_len} + {max_tokens} tokens exceed {name}'s {positions} positions"
        if isinstance(blocks, int) and isinstance(size, int) and size > 0:
            need = -(-prompt_len // size)
            if need > blocks:
                return f"a {prompt_len}-token prompt needs {need} blocks; {name} holds {blocks}"
    return None
