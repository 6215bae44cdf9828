"""``leaseproto replay FILE...``: run scenarios against the reference implementation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..scenarios.examples import example_path, example_paths
from ..scenarios.format import ScenarioError, parse_scenario
from ..scenarios.replay import replay

__all__ = ["format_event", "register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="replay a scenario (JSON lines) and print what P and D do",
        description="Read a scenario of timed inputs to P and D (spec §12 describes the "
        "format) and drive the real LeaseTable, HeartbeatTracker and wire codec "
        "through it, printing releases with reasons and times, heartbeats, late "
        "and early notifications. A FILE that is not a path names a bundled example "
        "(--list shows them). Exit status: 0 all expects held, 1 an expect "
        "failed, 2 a scenario is invalid or unreadable.",
    )
    p.add_argument(
        "files",
        metavar="FILE",
        nargs="*",
        help="scenario file, the name of a bundled example (e.g. d-crash), or '-' "
        "for standard input",
    )
    p.add_argument(
        "--list", action="store_true", help="list the bundled example scenarios and exit"
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object per event instead of text"
    )
    p.set_defaults(func=run)


def format_event(t: float, where: str, text: str) -> str:
    """One event as a line of text: time, place, what happened."""
    return f"{t:9.3f}  {where:<6} {text}"


def _read(name: str) -> tuple[str, str]:
    """The scenario's display name and text."""
    if name == "-":
        return "-", sys.stdin.read()
    path = Path(name)
    if not path.exists():
        bundled = example_path(name)
        if bundled is not None:
            path = bundled
    return name, path.read_text(encoding="utf-8")


def _run_one(name: str, as_json: bool) -> int:
    try:
        shown, text = _read(name)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"leaseproto replay: cannot read {name}: {exc}", file=sys.stderr)
        return 2
    try:
        scenario = parse_scenario(text)
    except ScenarioError as exc:
        print(f"leaseproto replay: {shown}: {exc}", file=sys.stderr)
        return 2
    result = replay(scenario)
    for ev in result.events:
        if as_json:
            print(
                json.dumps(
                    {
                        "t": ev.t,
                        "where": ev.where,
                        "kind": ev.kind,
                        "line": ev.line,
                        "text": ev.text,
                        **ev.data,
                    },
                    sort_keys=False,
                )
            )
        else:
            print(format_event(ev.t, ev.where, ev.text))
    if result.error is not None:
        print(f"leaseproto replay: {shown}: {result.error}", file=sys.stderr)
        return 2
    return 0 if result.ok else 1


def run(args: argparse.Namespace) -> int:
    if args.list:
        for path in example_paths():
            print(path.stem)
        return 0
    if not args.files:
        print(
            "leaseproto replay: name at least one scenario FILE (--list shows the bundled "
            "examples)",
            file=sys.stderr,
        )
        return 2
    status = 0
    for i, name in enumerate(args.files):
        if len(args.files) > 1 and not args.json:
            print(("\n" if i else "") + f"== {name}")
        status = max(status, _run_one(name, args.json))
    return status
