"""``leaseproto check-trace FILE...``: validate the traces of one real run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..checker.trace import TraceError, check_files
from ..checker.trace_timing import DEFAULT_SLACK
from ._errors import fail

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "check-trace",
        help="check the event traces of one run (serve --trace) against the spec",
        description="Merge the traces the workers of one run wrote (leaseproto serve ... "
        "--trace FILE), match every notification received to its send, replay each "
        "prefill rank through a fresh LeaseTable and the transition rules, and check "
        "that every decode rank used a read only after P's OK. Prints a summary; on a "
        "violation prints the first event no legal transition explains (file:line and "
        "the invariant's id) and exits with status 1.",
    )
    p.add_argument("files", metavar="FILE", nargs="+", help="a worker's trace")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--all", action="store_true", help="print every violation, not only the first")
    p.add_argument(
        "--timing",
        action="store_true",
        help="count I8 and I11 findings as violations (they need spec §5's timing "
        "assumptions, which a paused or overloaded worker breaks; reported either way)",
    )
    p.add_argument(
        "--slack",
        type=float,
        default=DEFAULT_SLACK,
        help=f"seconds of slack for I8 and I11 (default {DEFAULT_SLACK})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        report = check_files(args.files, timing=args.timing, slack=args.slack)
    except OSError as exc:
        return fail("check-trace", f"cannot read {exc.filename}: {exc.strerror or exc}")
    except TraceError as exc:
        return fail("check-trace", str(exc))
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(report.summary())
        shown = (
            sorted(report.violations, key=lambda v: (v.event.t, v.event.path, v.event.line))
            if args.all
            else [v for v in [report.first()] if v is not None]
        )
        for v in shown:
            print(f"VIOLATION {v}")
    return 0 if report.ok else 1
