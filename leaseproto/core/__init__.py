"""The sans-I/O lease core: pure state machines that own no clock and do no I/O.

Every time-dependent call takes keyword-only ``now`` (seconds on the caller's
monotonic clock). Nothing in this folder imports anything of :mod:`leaseproto`
outside it, nor any module that reads a clock or touches the outside world
(``tests/test_core_purity.py`` checks the folder).

- :mod:`.config`: :class:`LeaseConfig` and its derived values and rules (C1...).
- :mod:`.state`: the per-lease transition table, as data (:data:`TRANSITIONS`).
- :mod:`.rules`: the transition rules, written once, run on floats here and
  on z3 terms in ``leaseproto.proofs``; :mod:`.sym` holds their operators.
- :mod:`.table`: :class:`LeaseTable`, prefill's record of leases; :mod:`.lease`
  one lease's record and the table's counters.
- :mod:`.tracker`: :class:`HeartbeatTracker`, decode's heartbeat schedule.
- :mod:`.clock`: :class:`ClockOffset`, the bidirectional read gate.
- :mod:`.push`: :class:`PushRegistrations`, D's use and quarantine decisions for
  push registrations (I15).
- :mod:`.wire`: the notification formats (vLLM's and ours) and the verdict rule's
  message (:func:`~leaseproto.core.wire.verdict`, I13); :mod:`.wire_ids` which
  request ids may go on the wire and the message prefixes they may not begin with.
- :mod:`.mac`, :mod:`.mac_peers`: the cluster key's sealed frames (HMAC-SHA256,
  anti-replay window) and one agent's connections under it (spec §3.6, §10.3).
- :mod:`.events`, :mod:`.errors`: what the core returns and raises; :mod:`.checks`
  the argument checks behind its ``LocalProtocolError`` s.
"""

from __future__ import annotations

from . import wire
from .clock import ClockOffset
from .config import LeaseConfig
from .errors import LeaseProtocolError, LocalProtocolError, RemoteProtocolError
from .events import LateTransfer, Release, ReleaseReason, Releases, TransferCounted
from .push import PushRegistrations
from .state import TRANSITIONS, Guard, Input, LeaseState, Transition
from .table import LeaseTable, TableStats
from .tracker import HeartbeatTracker, TrackerStats
from .wire import MalformedMessage

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
    "PushRegistrations",
    "Release",
    "ReleaseReason",
    "Releases",
    "RemoteProtocolError",
    "TableStats",
    "TrackerStats",
    "TransferCounted",
    "Transition",
    "wire",
]
