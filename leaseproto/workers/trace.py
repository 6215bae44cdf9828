"""The workers' event trace: :mod:`leaseproto.adapters.trace_writer` (shared
with the vLLM connector, which may not import the workers)."""

from __future__ import annotations

from ..adapters.trace_writer import (
    NO_TRACE,
    TRACE_VERSION,
    NoTrace,
    TraceWriter,
    open_trace,
    text,
)

__all__ = ["NO_TRACE", "TRACE_VERSION", "NoTrace", "TraceWriter", "open_trace", "text"]
