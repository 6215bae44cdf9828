"""Prefill, decode and router worker processes built on the adapters, and the
tiny deterministic model whose KV cache they move (:mod:`.model`).

Modules import torch, NIXL and ZeroMQ themselves; importing this package
imports nothing heavy.
"""

from __future__ import annotations

__all__: list[str] = []
