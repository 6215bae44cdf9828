"""``leaseproto check``: the explicit-state model checker over the real classes."""

from __future__ import annotations

import argparse
from typing import Any

from ..checker import SCOPES, check
from ._flag_types import positive_int

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "check",
        help="model-check every interleaving of a bounded world (the real LeaseTable, "
        "HeartbeatTracker and wire)",
        description="Explore every state of a bounded world breadth-first: grants, "
        "heartbeats, reads and their transfer-dones, verdicts, aborts, reaps, faults "
        "and a lossy, duplicating network, executing the real core classes. Prints the "
        "distinct-state count and time, or the invariant violated and the shortest "
        "trace to it (exit status 1).",
    )
    p.add_argument("--scope", choices=sorted(SCOPES), default="small", help="the world to explore")
    p.add_argument(
        "--max-states",
        type=positive_int,
        default=None,
        help="stop after this many distinct states (default: the scope's own bound, above its "
        "state count for every scope but large, so a run as typed is exhaustive; large stops "
        "at 1,000,000)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    scope = SCOPES[args.scope]
    if args.max_states is not None:
        scope = scope.with_(max_states=args.max_states)
    res = check(scope)
    print(res.summary())
    return 0 if res.ok else 1
