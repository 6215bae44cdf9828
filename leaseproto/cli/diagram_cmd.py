"""``leaseproto spec-diagrams``: print the state diagrams generated from the
transition table, or check/refresh the copies embedded in spec files."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..scenarios import diagram as _diagram
from ._errors import fail

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "spec-diagrams",
        help="print the spec's state diagrams, generated from the code's tables",
        description="Print P's lease state machine (from leaseproto.core.state.TRANSITIONS) and "
        "D's tracking machines, or check/rewrite the generated blocks of spec files.",
    )
    p.add_argument(
        "--mermaid", action="store_true", help="print P's machine as a Mermaid stateDiagram instead"
    )
    p.add_argument(
        "--check",
        metavar="FILE",
        nargs="+",
        help="exit 1 if a generated block in FILE is out of date",
    )
    p.add_argument(
        "--write", metavar="FILE", nargs="+", help="rewrite the generated blocks in FILE in place"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (OSError, UnicodeDecodeError) as exc:
        name = getattr(exc, "filename", None) or "a spec file"
        return fail("spec-diagrams", f"cannot read or write {name}: {exc}")


def _run(args: argparse.Namespace) -> int:
    status = 0
    for path in args.check or ():
        with open(path, encoding="utf-8") as fh:
            stale = _diagram.stale_blocks(fh.read())
        for name in stale:
            print(
                f"{path}: generated block {name!r} is out of date "
                f"(run: leaseproto spec-diagrams --write {path})",
                file=sys.stderr,
            )
        status = 1 if stale else status
    for path in args.write or ():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        new = _diagram.render_blocks(text)
        if new != text:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
            print(f"{path}: updated")
    if args.check or args.write:
        return status
    if args.mermaid:
        print(_diagram.lease_mermaid(), end="")
        return 0
    print("P: per-request lease (from leaseproto.core.state.TRANSITIONS)\n")
    print(_diagram.lease_ascii())
    print(_diagram.lease_table_markdown())
    print("D: per-request tracking and per-engine heartbeat schedule\n")
    print(_diagram.tracker_ascii(), end="")
    return 0
