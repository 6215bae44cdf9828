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
from ._errors import EXTRA_OF, USAGE, missing_extra

__all__ = ["CommandParser", "DefaultsFormatter", "build_parser", "main"]

#: Subcommand modules, in the order ``--help`` lists them.
_COMMANDS: tuple[str, ...] = (
    "config_cmd",
    "replay_cmd",
    "diagram_cmd",
    "sim_cmd",
    "prove_cmd",
    "check_cmd",
    "check_trace_cmd",
    "demo_cmd",
    "serve_cmd",
    "generate_cmd",
    "trace_cmd",
)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows every option's default: ``(default: X)`` is added to an
    option whose help does not already say its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.option_strings
            and not any(action.default is v for v in (None, False, True, argparse.SUPPRESS))
            and action.default not in ([], ())
            and action.nargs != 0
            and "default" not in text
        ):
            text += (" " if text else "") + "(default: %(default)s)"
        return text


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                out += _all_parsers(child)
    return out


class CommandParser(argparse.ArgumentParser):
    """A parser with subcommands that names what is wrong when none is given:
    ``leaseproto --bogus`` says ``unrecognized arguments: --bogus``, not
    argparse's ``the following arguments are required: COMMAND``."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and (
                getattr(ns, action.dest, None) is None
            ):
                names = ", ".join(action.choices)
                if extras:
                    self.error(
                        f"unrecognized arguments: {' '.join(extras)} (name a "
                        f"{action.metavar} first: {names}; add --help to one for its options)"
                    )
                self.error(f"name a {action.metavar}: {names}")
        return ns, extras


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="leaseproto",
        description="KV-cache lease protocol for disaggregated prefill/decode serving.",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # not required: CommandParser says what is missing, after any unknown option
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        module = importlib.import_module(f"{__name__}.{name}")
        module.register(sub)
    for p in _all_parsers(parser):
        p.formatter_class = DefaultsFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = " ".join(str(getattr(args, k)) for k in ("command", "role") if getattr(args, k, None))
    try:
        status: int = args.func(args)
        sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C: each command cleans up in its own finally blocks
        print(f"\nleaseproto {command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:  # an optional dependency a command imports on use
        if (exc.name or "").split(".")[0] not in EXTRA_OF:
            raise
        print(f"leaseproto {command}: {missing_extra(exc)}", file=sys.stderr)
        return USAGE
    except BrokenPipeError:  # the reader went away (`leaseproto replay d-crash | head`)
        # what is still buffered can never be written; point stdout at devnull so that
        # the interpreter's own flush at exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
