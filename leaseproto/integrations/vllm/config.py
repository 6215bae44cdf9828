"""Lease settings of a vLLM engine, read from ``kv_connector_extra_config``.

No vLLM import: this module is used by the connector and by tests without vLLM.

vLLM derives its heartbeat interval and lease extension from one key with
integer floor division (``kv_lease_duration // 6`` on D's scheduler,
``kv_lease_duration * 2 // 3`` on P's worker). A leaseproto engine derives the
same two numbers, so a mixed pair (one side stock vLLM) agrees on them. Values
where that derivation degenerates are refused at start-up:

* **V1** ``kv_lease_duration // 6 >= 1``: below 6 vLLM's interval is 0, i.e. a
  heartbeat on every engine step.

Everything else is checked by :class:`leaseproto.LeaseConfig` (rules C1-C6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from leaseproto import LeaseConfig

__all__ = [
    "DEFAULT_KV_LEASE_DURATION",
    "lease_config_from_extra_config",
    "seconds_below",
    "vllm_derivation",
]

#: vLLM's default ``kv_lease_duration`` (seconds).
DEFAULT_KV_LEASE_DURATION = 30


def vllm_derivation(duration: float) -> tuple[float, float]:
    """(heartbeat interval, lease extension) exactly as vLLM 0.32 computes them."""
    return duration // 6, duration * 2 // 3


def lease_config_from_extra_config(extra: Mapping[str, Any] | None) -> LeaseConfig:
    """The :class:`LeaseConfig` of an engine whose ``kv_connector_extra_config``
    is ``extra``.

    ``heartbeat_interval`` and ``lease_extension`` default to vLLM's integer
    derivation from ``kv_lease_duration`` (default 30), not to the core's exact
    ``/ 6`` and ``* 2 / 3``; setting them explicitly is allowed (both sides of a
    pair must then agree). Other keys are read by
    :meth:`LeaseConfig.from_extra_config`.

    Raises:
        ValueError: naming the key and the rule broken (V1 above, or C1-C6).
    """
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        return LeaseConfig.from_extra_config(extra)  # raises with rule C6
    known = dict(extra)
    duration = known.setdefault("kv_lease_duration", DEFAULT_KV_LEASE_DURATION)
    if not isinstance(duration, bool) and isinstance(duration, (int, float)) and duration > 0:
        interval, extension = vllm_derivation(duration)
        if interval < 1 and "heartbeat_interval" not in known:
            raise ValueError(
                f"kv_lease_duration={duration!r} must be at least 6 (rule V1: vLLM derives the "
                f"heartbeat interval as kv_lease_duration // 6 = {interval:g}, i.e. a heartbeat "
                "on every engine step)"
            )
        known.setdefault("heartbeat_interval", interval)
        known.setdefault("lease_extension", extension)
    return LeaseConfig.from_extra_config(known)


def seconds_below(
    extra: Mapping[str, Any] | None, key: str, default: float, bound: float, bound_name: str
) -> float:
    """``extra[key]`` (default ``default``): a number of seconds, at least 0 and below
    ``bound`` (what ``bound_name`` calls it, for the error).

    Raises:
        ValueError: not a finite number (a bool is not one), negative, or not below
            ``bound``; the message names the key, the value and the rule.
    """
    value = default if not extra else extra.get(key, default)
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and 0 <= value < bound
    )
    if not ok:
        raise ValueError(
            f"{key}={value!r} must be a number of seconds, at least 0 and below "
            f"{bound_name} ({bound:g} s)"
        )
    return float(value)
