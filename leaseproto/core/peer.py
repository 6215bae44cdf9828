"""The lease settings a prefill engine advertises to the decode engines that
read from it, and the check a decode engine makes of them at first contact.

P puts :func:`advertisement` in the transfer parameters it hands to D, under
the key :data:`PARAMS_KEY` (vLLM: ``kv_transfer_params["leaseproto"]``), its
settings as durations (never instants: clocks are not shared). D parses it
with :meth:`PeerLease.parse` and asks :func:`mismatch` whether its own
heartbeat interval can keep P's leases alive: spec §5.3's

    T2 (steady state):  H/(1-rho) + S_D + delta + S_P  <  E/(1+rho)
    T1 (first heartbeat): R + max(K, H/(1-rho)) + S_D + delta + S_P  <  L/(1+rho)

with ``H`` D's heartbeat interval and ``E``, ``L`` P's lease extension and
initial lease. D knows ``H`` and (at best) a floor for its own step time
``S_D``; the delays are unknown, so the check is the part that needs no
assumption: with ``rho = 0`` and every unknown term 0, ``H + S_D < E`` and
``H + S_D < L``. A pair that fails it cannot work on any network: P expires
leases D is still renewing (P at a 3 s lease, D at 30 s: D heartbeats every
5 s, P extends by 2 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .config import LeaseConfig

__all__ = ["PARAMS_KEY", "PeerLease", "advertisement", "first_contact", "fragile", "mismatch"]

#: The key of the advertisement in the transfer parameters.
PARAMS_KEY = "leaseproto"
#: Version of the advertisement's format.
VERSION = 1


def advertisement(config: LeaseConfig) -> dict[str, Any]:
    """What P hands to D: ``{"v": 1, "lease": {durations, seconds}}``."""
    return {
        "v": VERSION,
        "lease": {
            "kv_lease_duration": config.kv_lease_duration,
            "lease_extension": config.lease_extension,
            "heartbeat_interval": config.heartbeat_interval,
            "max_lease_lifetime": config.max_lease_lifetime,
        },
    }


def _seconds(d: dict[str, Any], key: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"advertised lease setting {key!r} must be seconds > 0, got {v!r}")
    return float(v)


def _optional_seconds(d: dict[str, Any], key: str) -> float | None:
    return None if d.get(key) is None else _seconds(d, key)


@dataclass(frozen=True)
class PeerLease:
    """P's lease settings as it advertised them (seconds)."""

    kv_lease_duration: float
    lease_extension: float
    heartbeat_interval: float | None = None
    max_lease_lifetime: float | None = None

    @classmethod
    def parse(cls, adv: object) -> PeerLease:
        """From the advertisement. Raises ``ValueError`` naming the bad field."""
        if not isinstance(adv, dict) or not isinstance(adv.get("lease"), dict):
            raise ValueError(f"the {PARAMS_KEY!r} transfer parameter must be a map with 'lease'")
        if adv.get("v") != VERSION:
            raise ValueError(f"unknown {PARAMS_KEY!r} version {adv.get('v')!r}")
        lease = adv["lease"]
        return cls(
            kv_lease_duration=_seconds(lease, "kv_lease_duration"),
            lease_extension=_seconds(lease, "lease_extension"),
            heartbeat_interval=_optional_seconds(lease, "heartbeat_interval"),
            max_lease_lifetime=_optional_seconds(lease, "max_lease_lifetime"),
        )


def mismatch(peer: PeerLease, own: LeaseConfig, *, step_time: float = 0.0) -> str | None:
    """Why D's heartbeats (``own``) cannot keep ``peer``'s leases alive, or None.

    ``step_time``: a floor for D's own step time (``S_D``), seconds.
    """
    h = own.heartbeat_interval
    broken = []
    if not h + step_time < peer.lease_extension:
        broken.append(
            f"T2: D's heartbeat_interval {h:g} s{_plus(step_time)} must be below P's "
            f"lease_extension {peer.lease_extension:g} s"
        )
    if not h + step_time < peer.kv_lease_duration:
        broken.append(
            f"T1: D's heartbeat_interval {h:g} s{_plus(step_time)} must be below P's "
            f"kv_lease_duration {peer.kv_lease_duration:g} s"
        )
    if not broken:
        return None
    return (
        "; ".join(broken)
        + " (spec §5.3): P would expire leases D is still renewing. Give both sides the "
        "same lease settings (--kv-lease-duration, --heartbeat-interval, --lease-extension)"
    )


def fragile(peer: PeerLease, own: LeaseConfig) -> str | None:
    """A pair that works only while no heartbeat is lost (``ceil(E / H) - 2 < 1``,
    as :attr:`LeaseConfig.tolerated_missed_heartbeats`), or None."""
    h, e = own.heartbeat_interval, peer.lease_extension
    if h < e and math.ceil(e / h) - 2 < 1:
        return (
            f"P's lease_extension {e:g} s over D's heartbeat_interval {h:g} s tolerates no "
            "lost heartbeat: one late heartbeat expires a lease"
        )
    return None


def first_contact(
    leases: Sequence[PeerLease | None], own: LeaseConfig, *, step_time: float = 0.0
) -> tuple[str | None, str | None]:
    """D's check of a P engine whose ranks advertised ``leases`` (rank order;
    None: that rank did not advertise): why it cannot work (:func:`mismatch`),
    and a warning (:func:`fragile`), each naming the first rank concerned."""
    for rank, peer in enumerate(leases):
        why = None if peer is None else mismatch(peer, own, step_time=step_time)
        if why is not None:
            return f"P rank {rank}: {why}", None
    for rank, peer in enumerate(leases):
        warn = None if peer is None else fragile(peer, own)
        if warn is not None:
            return None, f"P rank {rank}: {warn}"
    return None, None


def _plus(step_time: float) -> str:
    return f" + step time {step_time:g} s" if step_time > 0 else ""
