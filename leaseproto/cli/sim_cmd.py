"""``leaseproto sim``: compare timeout policies on one simulated fleet."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import check_writable, fail
from ._flag_types import non_negative_float, positive_float, positive_int
from ._lease_flags import add_lease_flags, lease_kwargs

__all__ = ["parse_policies", "register"]

_PRESET_NAMES = ("surge", "crash", "both", "scale", "internet", "hang")
_DEFAULT_POLICIES = "fixed:480,fixed:30,lease,cap:300"
_SCENARIO_FLAGS: tuple[tuple[str, Callable[[str], object], str], ...] = (
    ("duration", positive_float, "arrivals window, s"),
    ("rate", non_negative_float, "steady arrival rate, requests/s"),
    ("p_engines", positive_int, "prefill engines"),
    ("d_engines", positive_int, "decode engines"),
    ("d_slots", positive_int, "running-set capacity per decode engine"),
    ("delay_jitter", non_negative_float, "notification delay jitter, s"),
    ("stall_rate", non_negative_float, "D forward-pass stalls per engine-second"),
)
_LEASE_FLAGS = (
    "kv_lease_duration",
    "heartbeat_interval",
    "lease_extension",
    "max_notification_bytes",
)


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sim",
        help="simulate a P/D fleet in virtual time and compare timeout policies",
        description="Run a discrete-event simulation of prefill and decode engines in virtual "
        "time around the real LeaseTable, HeartbeatTracker and wire format, and "
        "compare policies (fixed timeouts, lease renewal, lease renewal with a cap) "
        "on the same seeded workload.",
    )
    p.add_argument(
        "--preset",
        choices=_PRESET_NAMES,
        default="both",
        help="scenario (default: both = a surge and a D crash)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload")
    p.add_argument(
        "--policies",
        default=_DEFAULT_POLICIES,
        metavar="LIST",
        help=f"comma-separated: fixed:SECONDS, lease, cap:SECONDS (default {_DEFAULT_POLICIES})",
    )
    for key, typ, text in _SCENARIO_FLAGS:
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            type=typ,
            default=None,
            help=f"{text} (overrides the preset)",
        )
    add_lease_flags(p, _LEASE_FLAGS, note="; lease policies only")
    p.add_argument(
        "--sample-dt",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="spacing of the raw series (default duration/600)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write figures.json, figures.csv, series.csv, death_to_release.csv",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw P's held blocks over time per policy (needs leaseproto[plot])",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        metavar="N",
        help="run the policies in N processes (no progress bar; the figures are the same)",
    )
    bar = p.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal and rich, "
        "of the serve extra, is installed)",
    )
    bar.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run)


def parse_policies(text: str, lease_cfg: Any) -> list[Any]:
    """Policies named by ``--policies``.

    Raises:
        ValueError: an unknown token or a bad number.
    """
    from ..sim import Policy, replace_cap  # noqa: PLC0415

    out: list[Any] = []
    for token in (t.strip() for t in text.split(",")):
        kind, _, arg = token.partition(":")
        try:
            if kind == "fixed" and arg:
                out.append(Policy.fixed(float(arg)))
            elif kind == "lease" and not arg:
                out.append(Policy.lease(lease_cfg))
            elif kind == "cap" and arg:
                cap = float(arg)
                out.append(Policy.lease(replace_cap(lease_cfg, cap), name=f"lease+cap {cap:g}s"))
            else:
                raise ValueError("expected fixed:SECONDS, lease or cap:SECONDS")
        except ValueError as exc:
            raise ValueError(f"--policies: bad entry {token!r}: {exc}") from exc
    if not out:
        raise ValueError("--policies names no policy")
    return out


def run(args: argparse.Namespace) -> int:
    from .. import LeaseConfig  # noqa: PLC0415
    from ..sim import Progress, compare, preset  # noqa: PLC0415
    from ..sim.report import plot, print_report, write_files  # noqa: PLC0415

    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        return fail("sim", "--plot needs matplotlib: pip install 'leaseproto[plot]'")
    try:
        if args.out is not None:
            check_writable(args.out, folder=True)
        if args.plot is not None:
            check_writable(args.plot, folder=False)
        overrides = {
            k: getattr(args, k) for k, _, _ in _SCENARIO_FLAGS if getattr(args, k) is not None
        }
        scenario = preset(args.preset, **overrides)
        policies = parse_policies(args.policies, LeaseConfig(**lease_kwargs(args, _LEASE_FLAGS)))
    except ValueError as exc:
        return fail("sim", str(exc))
    show = sys.stderr.isatty() if args.progress is None else args.progress
    show = show and Progress.available() and args.jobs == 1
    comp = compare(
        scenario,
        seed=args.seed,
        policies=policies,
        sample_dt=args.sample_dt,
        progress=Progress() if show else None,
        jobs=args.jobs,
        keep_runs=False,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "scenario": scenario.name,
                    "seed": args.seed,
                    "wall_s": comp.wall_s,
                    "cpu_s": comp.cpu_s,
                    "figures": [f.as_dict() for f in comp.figures],
                },
                indent=1,
            )
        )
    else:
        print_report(comp, sys.stdout)
    if args.out is not None:
        for path in write_files(comp, args.out):
            print(f"wrote {path}", file=sys.stderr)
    if args.plot is not None:
        plot(comp, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0
