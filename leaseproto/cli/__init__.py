"""The ``leaseproto`` console script.

Each subcommand lives in its own module under :mod:`leaseproto.cli` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning the exit status. Subcommands import
their heavy dependencies (z3, torch, NIXL) inside ``func`` so that
``leaseproto --help`` and ``leaseproto config`` work on a bare install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]

#: Subcommand modules, in the order ``--help`` lists them.
_COMMANDS: tuple[str, ...] = (
    "config_cmd",
    "replay_cmd",
    "diagram_cmd",
    "sim_cmd",
    "prove_cmd",
    "demo_cmd",
    "serve_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leaseproto",
        description="KV-cache lease protocol for disaggregated prefill/decode serving.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
