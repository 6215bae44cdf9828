"""Thin I/O adapters around the sans-I/O core: no protocol logic lives here.

* :mod:`leaseproto.adapters.nixl`: :class:`~leaseproto.adapters.nixl.NixlEndpoint`,
  one NIXL agent (UCX) with non-blocking connect, notifications that never
  raise transport errors into the engine loop, and READ transfers.
* :mod:`leaseproto.adapters.kv_pool`: :class:`~leaseproto.adapters.kv_pool.KVPool`,
  a paged KV block pool in torch with per-block and per-head-range NIXL
  descriptors.

Nothing is imported here: each module pulls in its heavy dependency (NIXL,
torch) itself, so importing the package costs nothing.
"""

from __future__ import annotations

__all__: list[str] = []
