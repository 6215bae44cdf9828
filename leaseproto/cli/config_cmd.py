"""``leaseproto config``: print the effective, derived configuration."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.config import LeaseConfig
from ._lease_flags import add_extra_config_flag, add_lease_flags, config_from_args

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "config",
        help="print the effective configuration and the bounds it implies",
        description="Validate lease settings and print every effective value, derived ones "
        "included, with the timing bounds they imply. Unsafe values are rejected "
        "with the rule they break (exit status 2).",
    )
    add_lease_flags(p)
    add_extra_config_flag(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def bounds(cfg: LeaseConfig) -> dict[str, float | int | None]:
    """Figures implied by the configuration (spec §5)."""
    return {
        "tolerated_missed_heartbeats": cfg.tolerated_missed_heartbeats,
        "reclaim_after_silence_max": cfg.lease_extension,
        "reclaim_if_never_renewed": cfg.kv_lease_duration,
        "max_hold": cfg.max_lease_lifetime,
    }


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"leaseproto config: unsafe configuration: {exc}", file=sys.stderr)
        return 2
    values = cfg.as_dict()
    derived = bounds(cfg)
    if args.json:
        print(json.dumps({"config": values, "bounds": derived}, indent=2))
        return 0
    width = max(len(k) for k in (*values, *derived))
    print("effective configuration")
    for key, value in values.items():
        print(f"  {key:<{width}}  {_fmt(value)}")
    print("implied bounds (spec §5)")
    notes = {
        "tolerated_missed_heartbeats": "consecutive heartbeats that may be lost",
        "reclaim_after_silence_max": "s after P's last received heartbeat, plus one step",
        "reclaim_if_never_renewed": "s after the grant",
        "max_hold": "s after the grant, whatever D does"
        if cfg.max_lease_lifetime
        else "no cap: a heartbeating D holds blocks indefinitely",
    }
    for key, value in derived.items():
        print(f"  {key:<{width}}  {_fmt(value)}  ({notes[key]})")
    return 0


def _fmt(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
