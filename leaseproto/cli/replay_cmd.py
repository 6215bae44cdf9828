"""``leaseproto replay FILE``: run a scenario against the reference implementation."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._replay import replay
from .._scenario import ScenarioError, parse_scenario

__all__ = ["format_event", "register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="replay a scenario (JSON lines) and print what P and D do",
        description="Read a scenario of timed inputs to P and D (spec §12 describes the "
                    "format) and drive the real LeaseTable, HeartbeatTracker and wire codec "
                    "through it, printing releases with reasons and times, heartbeats, late "
                    "and early notifications. Exit status: 0 all expects held, 1 an expect "
                    "failed, 2 the scenario is invalid.",
    )
    p.add_argument("file", metavar="FILE", help="scenario file ('-' reads standard input)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per event instead of text")
    p.set_defaults(func=run)


def format_event(t: float, where: str, text: str) -> str:
    """One event as a line of text: time, place, what happened."""
    return f"{t:9.3f}  {where:<6} {text}"


def run(args: argparse.Namespace) -> int:
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"leaseproto replay: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    try:
        scenario = parse_scenario(text)
    except ScenarioError as exc:
        print(f"leaseproto replay: {args.file}: {exc}", file=sys.stderr)
        return 2
    result = replay(scenario)
    for ev in result.events:
        if args.json:
            print(json.dumps({"t": ev.t, "where": ev.where, "kind": ev.kind, "line": ev.line,
                              "text": ev.text, **ev.data}, sort_keys=False))
        else:
            print(format_event(ev.t, ev.where, ev.text))
    if result.error is not None:
        print(f"leaseproto replay: {args.file}: {result.error}", file=sys.stderr)
        return 2
    return 0 if result.ok else 1
