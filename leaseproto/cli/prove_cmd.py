"""``leaseproto prove``: discharge the z3 proof obligations (``proofs/``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "prove",
        help="prove the protocol's invariants with z3 (one line per obligation)",
        description="Check every proof obligation of proofs/: initial states and every "
                    "transition preserve each invariant (I1...), no transition is vacuous, "
                    "and the timing theorems hold. Prints one line per obligation (ok or "
                    "FAIL with a counterexample); exit status 1 on any failure, 'unknown' "
                    "included. Needs z3-solver (pip install 'leaseproto[test]').",
    )
    p.add_argument("--only", metavar="ID", default=None,
                   help="only the obligations of one invariant id (e.g. I3)")
    p.add_argument("--system", metavar="NAME", default=None,
                   help="only one system's obligations (lease, lease-cap, engine, gate, "
                        "timing, timing-cap, timing-bounded)")
    p.add_argument("--counterexamples", action="store_true",
                   help="also print the schedules showing each timing assumption is needed "
                        "and each naive variant is broken")
    p.add_argument("--timeout-ms", type=int, default=20_000, metavar="MS",
                   help="z3 timeout per obligation (default 20000)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        check = importlib.import_module("proofs.check")
    except ImportError as exc:  # z3 missing, or proofs/ not installed
        print(f"leaseproto prove: cannot load the proofs ({exc}); install the test extra: "
              "pip install 'leaseproto[test]'", file=sys.stderr)
        return 2
    status: int = check.run(only=args.only, timeout_ms=args.timeout_ms,
                            counterexamples=args.counterexamples, system=args.system)
    return status
