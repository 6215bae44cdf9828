"""Lease-setting flags shared by the subcommands (``config``, ``serve``, ``sim``).

Every flag defaults to ``None`` so that :class:`~leaseproto.LeaseConfig` alone
supplies defaults and derived values; :func:`lease_kwargs` returns only the
flags the user gave.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = [
    "INT_KEYS",
    "LEASE_KEYS",
    "add_extra_config_flag",
    "add_lease_flags",
    "config_from_args",
    "lease_kwargs",
]

#: Every LeaseConfig key a flag can set, with its help text.
_HELP = {
    "kv_lease_duration": "initial lease P grants when prefill ends (default 30)",
    "decoder_kv_blocks_ttl": "fixed TTL of D-cached blocks, bidirectional mode (default 480)",
    "heartbeat_interval": "D heartbeats each P engine this often (default kv_lease_duration / 6)",
    "lease_extension": "a heartbeat extends to now + this (default kv_lease_duration * 2 / 3)",
    "max_lease_lifetime": "hard cap on a lease's life (default: none)",
    "safety_margin": "margin of the bidirectional read gate (default 5)",
    "tombstone_ttl": "how long ended leases are remembered (default decoder_kv_blocks_ttl)",
    "staging_ttl": "how long early notifications are kept (default kv_lease_duration)",
    "max_notification_bytes": "largest heartbeat notification (default 4096)",
    "tombstone_capacity": "most ended leases remembered (default 100000)",
    "staging_capacity": "most early notifications kept (default 10000)",
}
LEASE_KEYS = tuple(_HELP)
INT_KEYS = frozenset({"max_notification_bytes", "tombstone_capacity", "staging_capacity"})


def add_lease_flags(p: Any, keys: tuple[str, ...] = LEASE_KEYS, *, note: str = "") -> None:
    """Add ``--<key>`` for each key to ``p`` (a parser or an argument group)."""
    for key in keys:
        is_int = key in INT_KEYS
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            default=None,
            type=int if is_int else float,
            metavar="N" if is_int else "SECONDS",
            help=_HELP[key] + note,
        )


def lease_kwargs(args: argparse.Namespace, keys: tuple[str, ...] = LEASE_KEYS) -> dict[str, Any]:
    """The lease flags the user gave, as ``LeaseConfig`` keyword arguments."""
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def add_extra_config_flag(p: Any) -> None:
    """Add ``--kv-connector-extra-config JSON``: the dict vLLM's
    ``kv_connector_extra_config`` takes (``--extra-config`` is an alias)."""
    p.add_argument(
        "--kv-connector-extra-config",
        "--extra-config",
        dest="extra_config",
        metavar="JSON",
        default=None,
        help="a JSON object, the same dict as vLLM's kv_connector_extra_config "
        "(keys other than the lease settings are ignored; a flag overrides its key)",
    )


def config_from_args(args: argparse.Namespace, keys: tuple[str, ...] = LEASE_KEYS) -> Any:
    """The :class:`~leaseproto.LeaseConfig` of ``--kv-connector-extra-config`` and the
    lease flags (flags win).

    Raises:
        ValueError: invalid JSON, not an object, or an unsafe value (the message
            names the rule).
    """
    from ..core.config import LeaseConfig  # noqa: PLC0415

    extra: dict[str, Any] = {}
    text = getattr(args, "extra_config", None)
    if text is not None:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-connector-extra-config is not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ValueError("--kv-connector-extra-config must be a JSON object")
        extra.update(loaded)
    extra.update(lease_kwargs(args, keys))
    return LeaseConfig.from_extra_config(extra)
