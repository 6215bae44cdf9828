"""An explicit-state model checker over the real core classes (spec §9).

:func:`check` explores every interleaving of a bounded world (:class:`Scope`):
grants, heartbeats sent and delivered, reads with their transfer-dones,
verdicts, aborts, P's reaps, D crashing or pausing, P restarting, engines
reconnecting, and a network that delays, reorders, duplicates and loses within
stated bounds; with the roles swapped, the turn-2 read and push mode (spec §2.8:
:mod:`.push_world`, D's decisions by
:class:`~leaseproto.core.push.PushRegistrations`). It executes
:class:`~leaseproto.LeaseTable`, :class:`~leaseproto.HeartbeatTracker` and
:mod:`~leaseproto.wire` themselves,
deduplicates states by a canonical fingerprint, and reports the shortest trace
to the first violated invariant, by its spec id. It imports only the core, the
workers' own verdict decisions (:mod:`leaseproto.workers.verdicts`, which import
only the core) and the standard library.
"""

from .explore import Result, check
from .invariants import INVARIANTS
from .scope import SCOPES, Scope, scope_config
from .world import Violation, World

__all__ = ["INVARIANTS", "SCOPES", "Result", "Scope", "Violation", "World", "check", "scope_config"]
