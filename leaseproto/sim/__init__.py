"""``leaseproto.sim``: a fleet of prefill and decode engines in virtual time,
driving the real :class:`~leaseproto.LeaseTable`,
:class:`~leaseproto.HeartbeatTracker` and :mod:`~leaseproto.wire`, to compare
timeout policies on one seeded workload (``leaseproto sim``).
"""

from __future__ import annotations

from .figures import FIGURE_LABELS, Figures, Series, percentile
from .fleet import FleetRun
from .policy import DEFAULT_CAP, Policy, default_policies, replace_cap
from .runner import Comparison, Progress, compare
from .workload import PRESETS, Crash, Hang, Scenario, Surge, Workload, generate, preset

__all__ = [
    "DEFAULT_CAP",
    "FIGURE_LABELS",
    "PRESETS",
    "Comparison",
    "Crash",
    "Figures",
    "FleetRun",
    "Hang",
    "Policy",
    "Progress",
    "Scenario",
    "Series",
    "Surge",
    "Workload",
    "compare",
    "default_policies",
    "generate",
    "percentile",
    "preset",
    "replace_cap",
]
