"""``leaseproto prove``: discharge the z3 proof obligations (``proofs/``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ._flag_types import positive_int

__all__ = ["register"]

_INSTALL = "install the prove extra: pip install 'leaseproto[prove]'"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "prove",
        help="prove the protocol's invariants with z3 (one line per obligation)",
        description="Check every proof obligation of proofs/: initial states and every "
        "transition preserve each invariant (I1...), no transition is vacuous, "
        "and the timing theorems hold. Prints one line per obligation (ok or "
        "FAIL with a counterexample); exit status 1 on any failure, 'unknown' "
        "included. Needs z3-solver (" + _INSTALL + ").",
    )
    try:  # the options live with the proofs; importing them does not import z3
        options = importlib.import_module("leaseproto.proofs.options")
        options.add_arguments(p, count=positive_int)
    except ImportError:  # pragma: no cover - a distribution without proofs/
        p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        check = importlib.import_module("leaseproto.proofs.check")
    except ImportError as exc:  # z3 missing, or proofs/ not installed
        print(f"leaseproto prove: cannot load the proofs ({exc}); {_INSTALL}", file=sys.stderr)
        return 2
    status: int = check.run(
        only=args.only,
        timeout_ms=args.timeout_ms,
        counterexamples=args.counterexamples,
        system=args.system,
        scenarios=args.scenarios,
    )
    return status
