"""Trace files: reading one worker's trace (``--trace FILE``, JSON lines written by
:mod:`leaseproto.adapters.trace_writer`) into its header and events (spec §9.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .trace_events import Event, Violation

__all__ = ["TraceError", "TraceFile", "load"]


class TraceError(ValueError):
    """A file that is not a trace (no header, a line that is not JSON)."""


@dataclass
class TraceFile:
    """One worker's trace: its header, its events in order, and whether it
    ended cleanly (an ``end`` line; a killed worker's trace has none)."""

    path: str
    header: dict[str, Any]
    events: list[Event]
    complete: bool
    #: lines that are not events (not JSON, not an object with ``ev``), as violations
    bad: list[Violation] = field(default_factory=list)

    @property
    def agent(self) -> str:
        return str(self.header.get("agent", ""))

    @property
    def role(self) -> str:
        return str(self.header.get("role", ""))


def load(path: str | Path) -> TraceFile:
    """Read one trace. A last line cut off mid-write (a killed worker) is dropped;
    any other line that is not an event is kept as a ``format`` violation naming
    it (:attr:`TraceFile.bad`).

    Raises:
        OSError: it cannot be read.
        TraceError: it is not a trace (its first line is not a trace header).
    """
    name = str(path)
    raw = Path(path).read_text(encoding="ascii", errors="replace")
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # no newline after it: written only in part
    events: list[Event] = []
    bad: list[Violation] = []
    for i, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == 1:
                raise TraceError(f"{name}:{i}: not JSON: {exc}") from exc
            bad.append(Violation("format", Event(name, i, {}), f"not JSON: {exc}"))
            continue
        if not isinstance(obj, dict) or "ev" not in obj:
            if i == 1:
                raise TraceError(f"{name}:{i}: not a trace event")
            bad.append(Violation("format", Event(name, i, {}), "not a trace event"))
            continue
        if "data" in obj and not _latin1(obj["data"]):  # the writer's bytes, one char each
            why = f"data is not a string of bytes (latin-1): {obj['data']!r:.80}"
            bad.append(Violation("format", Event(name, i, {}), why))
            continue
        events.append(Event(name, i, obj))
    if not events or events[0].ev != "header" or events[0].line != 1:
        raise TraceError(f"{name}: no trace header (is it a --trace file?)")
    header = events[0].obj
    complete = events[-1].ev == "end"
    return TraceFile(name, header, events[1:], complete, bad)


def _latin1(data: object) -> bool:
    """Whether ``data`` is what a trace writes for bytes: a string of code points
    below 256 (:meth:`~.trace_events.Event.data` encodes it back)."""
    if not isinstance(data, str):
        return False
    try:
        data.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True
