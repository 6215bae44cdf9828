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
import os
import sys
from collections.abc import Sequence

from .. import __version__

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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`leaseproto replay d-crash | head`)
        # what is still buffered can never be written; point stdout at devnull so that
        # the interpreter's own flush at exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
