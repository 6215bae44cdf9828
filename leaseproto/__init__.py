"""leaseproto: the KV-cache lease protocol for disaggregated prefill/decode
serving, as a clock-free core (every time-dependent call takes ``now``).

Prefill side: :class:`LeaseTable`. Decode side: :class:`HeartbeatTracker`.
Between them: :mod:`leaseproto.wire`. Bidirectional reads: :class:`ClockOffset`.

The names below are the public API; they live in :mod:`leaseproto.core`.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from .core import (
    TRANSITIONS,
    ClockOffset,
    Guard,
    HeartbeatTracker,
    Input,
    LateTransfer,
    LeaseConfig,
    LeaseProtocolError,
    LeaseState,
    LeaseTable,
    LocalProtocolError,
    MalformedMessage,
    Release,
    ReleaseReason,
    Releases,
    RemoteProtocolError,
    TableStats,
    TrackerStats,
    TransferCounted,
    Transition,
    wire,
)

# `import leaseproto.wire` and `from leaseproto.wire import ...` name the core's module itself.
sys.modules[f"{__name__}.wire"] = wire

try:
    __version__ = version("leaseproto")
except (
    PackageNotFoundError
):  # pragma: no cover - imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "TRANSITIONS",
    "ClockOffset",
    "Guard",
    "HeartbeatTracker",
    "Input",
    "LateTransfer",
    "LeaseConfig",
    "LeaseProtocolError",
    "LeaseState",
    "LeaseTable",
    "LocalProtocolError",
    "MalformedMessage",
    "Release",
    "ReleaseReason",
    "Releases",
    "RemoteProtocolError",
    "TableStats",
    "TrackerStats",
    "TransferCounted",
    "Transition",
    "__version__",
    "wire",
]
