"""The command-line options of ``python -m leaseproto.proofs`` and ``leaseproto prove``
(no z3 import here, so ``leaseproto --help`` stays light)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

TIMEOUT_MS = 20_000
SYSTEMS = (
    "lease, lease-cap, engine, table, loops, structures, tracker, wire, settings, clock, gate, "
    "timing, timing-cap, timing-bounded, timing-reads, turn2, push"
)


def add_arguments(ap: argparse.ArgumentParser, *, count: Callable[[str], int] = int) -> None:
    """The options; ``count``: the argparse type of a count (``leaseproto prove``
    passes the CLI's check for a whole number >= 1)."""
    ap.add_argument(
        "--only",
        metavar="ID",
        default=None,
        help="only the obligations of one invariant id (e.g. I3), with the lemmas its proof uses",
    )
    ap.add_argument(
        "--system", metavar="NAME", default=None, help=f"only one system's obligations ({SYSTEMS})"
    )
    ap.add_argument(
        "--counterexamples",
        action="store_true",
        help="also print the schedules showing each timing assumption is needed "
        "and each naive variant is broken",
    )
    ap.add_argument(
        "--scenarios",
        metavar="DIR",
        default=None,
        help="with --counterexamples: write each schedule as a leaseproto replay scenario "
        "into DIR (each is also replayed on the real code and checked)",
    )
    ap.add_argument(
        "--timeout-ms",
        type=count,
        default=TIMEOUT_MS,
        metavar="MS",
        help=f"z3 timeout per obligation (default {TIMEOUT_MS})",
    )
