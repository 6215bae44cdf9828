"""Protocol configuration (spec §4, "Constants").

:class:`LeaseConfig` is frozen and validated when constructed: a value that
would make the protocol unsafe or meaningless raises :class:`ValueError` naming
the key and the rule (``C1``…``C6``) it breaks, in the manner of client-go's
``leaseDuration must be greater than renewDeadline``.

Rules:

* **C1** every duration is a finite number (``int`` or ``float``, not ``bool``)
  greater than zero; ``safety_margin`` may be zero.
* **C2** ``lease_extension > heartbeat_interval``: each heartbeat must push the
  deadline past the next one, or a single late heartbeat lapses the lease.
* **C3** ``heartbeat_interval < kv_lease_duration``: the initial lease must
  outlive one heartbeat interval, or it lapses before D's first heartbeat.
* **C4** ``max_lease_lifetime >= kv_lease_duration`` when a cap is set.
* **C5** counts (``max_notification_bytes``, ``tombstone_capacity``,
  ``staging_capacity``) are integers; ``max_notification_bytes >= 64``,
  ``tombstone_capacity >= 1``, ``staging_capacity >= 0``.
* **C6** ``from_extra_config`` takes a mapping; keys it does not know are left
  to their owner (vLLM's dict holds other connectors' keys too).
* **C7** ids fit the wire: the longest request id P grants and D tracks is
  :attr:`LeaseConfig.max_id_bytes` ``= min(MAX_ID_BYTES, max_notification_bytes
  - VERDICT_OVERHEAD)`` UTF-8 bytes, so every message naming one id (the
  longest is ``NK:transferred:<id>``) fits in one notification;
  ``LeaseTable.grant`` and ``HeartbeatTracker.track`` refuse longer ids.

C1 covers derived values too: a ``kv_lease_duration`` whose default extension
``2L/3`` overflows to infinity is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .wire import MAX_ID_BYTES, VERDICT_OVERHEAD

__all__ = ["DEFAULT_KV_LEASE_DURATION", "LeaseConfig"]

#: Default initial lease, seconds (vLLM ``kv_lease_duration``).
DEFAULT_KV_LEASE_DURATION = 30.0
#: Default fixed TTL of D-cached blocks in bidirectional mode (vLLM).
DEFAULT_DECODER_KV_BLOCKS_TTL = 480.0
#: Default margin of the bidirectional read gate (vLLM's hard-coded 5 s).
DEFAULT_SAFETY_MARGIN = 5.0
#: Default largest notification payload, bytes (spec §4; see upstream bug B5).
DEFAULT_MAX_NOTIFICATION_BYTES = 4096


def _number(key: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"{key}: expected a number of seconds, got {type(value).__name__} {value!r} (rule C1)"
        )
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{key}={value!r} must be finite (rule C1)")
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{key}={value!r} must be {bound} (rule C1)")
    return v


def _count(key: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{key}: expected an integer, got {type(value).__name__} {value!r} (rule C5)"
        )
    if value < minimum:
        raise ValueError(f"{key}={value!r} must be >= {minimum} (rule C5)")
    return value


@dataclass(frozen=True, init=False)
class LeaseConfig:
    """Effective, validated protocol constants. All durations in seconds.

    Attributes:
        kv_lease_duration: initial lease P grants when prefill ends.
        decoder_kv_blocks_ttl: fixed TTL of D-cached blocks (bidirectional mode).
        heartbeat_interval: D sends at most one heartbeat per P engine this
            often. Default ``kv_lease_duration / 6``.
        lease_extension: each heartbeat sets the deadline to at least
            ``now + lease_extension``. Default ``kv_lease_duration * 2 / 3``.
        max_lease_lifetime: hard cap: no renewal moves a deadline past
            ``granted_at + max_lease_lifetime``. ``None``: no cap.
        safety_margin: margin of the bidirectional read gate.
        max_notification_bytes: largest heartbeat notification D sends.
        tombstone_ttl: how long an ended lease is remembered to recognise late
            notifications. Default ``decoder_kv_blocks_ttl``.
        tombstone_capacity: most ended leases remembered.
        staging_ttl: how long a transfer-done for a not-yet-granted id is kept.
            Default ``kv_lease_duration``.
        staging_capacity: most such early notifications kept.
    """

    kv_lease_duration: float
    decoder_kv_blocks_ttl: float
    heartbeat_interval: float
    lease_extension: float
    max_lease_lifetime: float | None
    safety_margin: float
    max_notification_bytes: int
    tombstone_ttl: float
    tombstone_capacity: int
    staging_ttl: float
    staging_capacity: int

    def __init__(
        self,
        kv_lease_duration: float = DEFAULT_KV_LEASE_DURATION,
        decoder_kv_blocks_ttl: float = DEFAULT_DECODER_KV_BLOCKS_TTL,
        heartbeat_interval: float | None = None,
        lease_extension: float | None = None,
        max_lease_lifetime: float | None = None,
        *,
        safety_margin: float = DEFAULT_SAFETY_MARGIN,
        max_notification_bytes: int = DEFAULT_MAX_NOTIFICATION_BYTES,
        tombstone_ttl: float | None = None,
        tombstone_capacity: int = 100_000,
        staging_ttl: float | None = None,
        staging_capacity: int = 10_000,
    ) -> None:
        duration = _number("kv_lease_duration", kv_lease_duration)
        interval = (
            duration / 6
            if heartbeat_interval is None
            else _number("heartbeat_interval", heartbeat_interval)
        )
        extension = (
            duration * 2 / 3
            if lease_extension is None
            else _number("lease_extension", lease_extension)
        )
        if extension <= interval:
            raise ValueError(
                f"lease_extension={extension:g} must be greater than "
                f"heartbeat_interval={interval:g} (rule C2: a renewal must outlast the "
                "next heartbeat)"
            )
        if interval >= duration:
            raise ValueError(
                f"heartbeat_interval={interval:g} must be less than "
                f"kv_lease_duration={duration:g} (rule C3: the initial lease must outlive "
                "one heartbeat interval)"
            )
        cap = None
        if max_lease_lifetime is not None:
            cap = _number("max_lease_lifetime", max_lease_lifetime)
            if cap < duration:
                raise ValueError(
                    f"max_lease_lifetime={cap:g} must be at least "
                    f"kv_lease_duration={duration:g} (rule C4: the cap cannot be shorter "
                    "than the initial lease)"
                )
        d_ttl = _number("decoder_kv_blocks_ttl", decoder_kv_blocks_ttl)
        values: dict[str, Any] = {
            "kv_lease_duration": duration,
            "decoder_kv_blocks_ttl": d_ttl,
            "heartbeat_interval": interval,
            "lease_extension": extension,
            "max_lease_lifetime": cap,
            "safety_margin": _number("safety_margin", safety_margin, allow_zero=True),
            "max_notification_bytes": _count("max_notification_bytes", max_notification_bytes, 64),
            "tombstone_ttl": (
                d_ttl if tombstone_ttl is None else _number("tombstone_ttl", tombstone_ttl)
            ),
            "tombstone_capacity": _count("tombstone_capacity", tombstone_capacity, 1),
            "staging_ttl": (
                duration if staging_ttl is None else _number("staging_ttl", staging_ttl)
            ),
            "staging_capacity": _count("staging_capacity", staging_capacity, 0),
        }
        for key, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(
                    f"{key}={value!r}, derived from kv_lease_duration={duration!r}, "
                    "must be finite (rule C1)"
                )
            object.__setattr__(self, key, value)

    @classmethod
    def known_keys(cls) -> tuple[str, ...]:
        """Every configuration key, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> LeaseConfig:
        """Build from vLLM's ``kv_connector_extra_config`` dict.

        Reads ``kv_lease_duration`` and ``decoder_kv_blocks_ttl`` (vLLM's keys)
        and every other key of :meth:`known_keys`; other keys are ignored (rule C6).

        Raises:
            ValueError: ``extra`` is not a mapping, or a value breaks C1-C5.
        """
        if not isinstance(extra, Mapping):
            raise ValueError(
                f"kv_connector_extra_config: expected a mapping, got {type(extra).__name__} "
                "(rule C6)"
            )
        known = {k: extra[k] for k in cls.known_keys() if k in extra}
        return cls(**known)

    def as_dict(self) -> dict[str, float | int | None]:
        """The effective values, derived ones included."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def max_id_bytes(self) -> int:
        """The longest request id, in UTF-8 bytes, that ``grant`` and ``track``
        accept (rule C7): every message naming it fits in
        ``max_notification_bytes``."""
        return min(MAX_ID_BYTES, self.max_notification_bytes - VERDICT_OVERHEAD)

    @property
    def tolerated_missed_heartbeats(self) -> int:
        """How many consecutive heartbeats may be lost, with no delay at all,
        without the lease lapsing: the largest ``k`` with ``(k + 1) *
        heartbeat_interval < lease_extension``, i.e. ``ceil(E / H) - 2`` (2 at
        defaults: the 4th heartbeat after a renewal at t would land at t + 20,
        exactly on the deadline, which is too late)."""
        return math.ceil(self.lease_extension / self.heartbeat_interval) - 2
