"""The process harness: workers of ``leaseproto serve`` run as local processes,
and a client that talks to their router.

- :mod:`.cluster`: :class:`Cluster` starts a router, prefill and decode ranks
  on this host from a :class:`ClusterSpec`, kills and stops them, and checks
  their event traces when it stops (``leaseproto demo``, the end-to-end tests,
  the benchmarks);
- :mod:`.client`: :class:`RouterClient` submits requests to any router without
  blocking and collects the answers (``leaseproto generate``).
"""

from __future__ import annotations

from .client import RouterClient
from .cluster import Cluster, ClusterSpec, TraceViolation, Worker

__all__ = ["Cluster", "ClusterSpec", "RouterClient", "TraceViolation", "Worker"]
