"""The policies a simulation compares. Every one runs the real :class:`LeaseTable`.

* ``fixed N s``: upstream's behaviour before lease renewal: P grants ``N``
  seconds and nothing renews it (D sends no heartbeats).
* ``lease``: lease renewal: an initial ``kv_lease_duration``, D heartbeats every
  ``heartbeat_interval`` from the moment a request enters its waiting queue,
  each heartbeat extends to ``now + lease_extension``.
* ``lease+cap``: the same with ``max_lease_lifetime`` set.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import LeaseConfig

__all__ = ["DEFAULT_CAP", "Policy", "default_policies", "replace_cap"]

#: Lifetime cap of the ``lease+cap`` policy unless told otherwise, seconds.
DEFAULT_CAP = 300.0


@dataclass(frozen=True)
class Policy:
    """How P holds blocks and whether D heartbeats.

    Attributes:
        name: label in tables and files.
        config: the :class:`LeaseConfig` the table and tracker run with.
        heartbeats: D tracks requests and heartbeats; P renews.
        ttl: the ``ttl`` passed to :meth:`LeaseTable.grant` (``None``: the
            config's ``kv_lease_duration``).
    """

    name: str
    config: LeaseConfig
    heartbeats: bool
    ttl: float | None = None

    @classmethod
    def fixed(cls, ttl: float) -> Policy:
        """A one-shot timeout of ``ttl`` seconds: a lease nobody renews."""
        return cls(f"fixed {ttl:g}s", LeaseConfig(kv_lease_duration=ttl), False, ttl)

    @classmethod
    def lease(cls, config: LeaseConfig | None = None, name: str = "lease") -> Policy:
        return cls(name, config if config is not None else LeaseConfig(), True)

    @property
    def initial_ttl(self) -> float:
        return self.ttl if self.ttl is not None else self.config.kv_lease_duration


def default_policies(config: LeaseConfig | None = None, cap: float = DEFAULT_CAP) -> list[Policy]:
    """Fixed 480 s, fixed 30 s, lease renewal, lease renewal with a cap."""
    cfg = config if config is not None else LeaseConfig()
    capped = replace_cap(cfg, cap)
    return [
        Policy.fixed(480.0),
        Policy.fixed(30.0),
        Policy.lease(cfg),
        Policy.lease(capped, name=f"lease+cap {cap:g}s"),
    ]


def replace_cap(cfg: LeaseConfig, cap: float) -> LeaseConfig:
    """``cfg`` with ``max_lease_lifetime=cap`` (validated again)."""
    values = cfg.as_dict()
    values["max_lease_lifetime"] = cap
    return LeaseConfig(**values)  # type: ignore[arg-type]
