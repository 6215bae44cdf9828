"""leaseproto: the KV-cache lease protocol for disaggregated prefill/decode
serving, as a clock-free core (every time-dependent call takes ``now``).

Prefill side: :class:`LeaseTable`. Decode side: :class:`HeartbeatTracker`.
Between them: :mod:`leaseproto.wire`. Bidirectional reads: :class:`ClockOffset`.
"""

from __future__ import annotations

from . import wire
from ._clock import ClockOffset
from ._config import LeaseConfig
from ._errors import LeaseProtocolError, LocalProtocolError, RemoteProtocolError
from ._events import LateTransfer, Release, ReleaseReason
from ._state import TRANSITIONS, Guard, Input, LeaseState, Transition
from ._table import LeaseTable, TableStats
from ._tracker import HeartbeatTracker, TrackerStats
from .wire import MalformedMessage

__version__ = "0.1.0"

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
    "RemoteProtocolError",
    "TableStats",
    "TrackerStats",
    "Transition",
    "__version__",
    "wire",
]
