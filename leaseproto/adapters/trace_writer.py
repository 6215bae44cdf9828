"""A worker's structured event trace (``leaseproto serve ... --trace FILE``).

One JSON object per line, in the order the worker did things: first a
``header`` (role, engine, rank, agent, pid, host and boot id, policy, and the
lease configuration as durations), then one event per protocol step, each with
``t``, the worker's ``time.monotonic()`` reading, and ``ev``, its kind:

* every worker: ``send`` (``to``, ``data``, ``ok``: the NIXL notification and
  whether the endpoint took it), ``recv`` (``src``, ``data``: what a poll
  returned, before the size and sender gate), ``read`` (``to``, ``data``: a
  READ and the transfer-done NIXL delivers after it), ``end`` (a clean stop);
* prefill: ``grant`` (``req``, ``now``, ``consumers``, ``blocks``, ``lease``:
  the time left as a duration, ``null`` when the grant ended it at once),
  ``abort_req`` (a request-plane abort from the router), ``handle`` (``src``,
  ``data``, ``now``: a notification handed to the lease table), ``renew``
  (``now``, ``leases``: each live lease the heartbeat named and its time
  left), ``expire`` (``now``, ``n`` released), ``release`` (the fields of
  :class:`~leaseproto.core.events.Release` and ``blocks``);
* decode: ``use`` (``req``, ``remote``, ``ok_from``: the P agents whose ``OK``
  the read waited for) when a rank uses what it read.

Notification bytes are written as latin-1 text (lossless). ``leaseproto
check-trace`` merges the traces of one run and checks them against the spec;
``leaseproto trace REQ_ID`` reads them too. A trace is written line by line
(line buffered), so a worker killed with SIGKILL leaves every line before the
kill; an ``expire`` that released nothing is held and written only before the
next event (the next ``expire`` does all it did), so an idle loop costs
nothing. Off by default: :data:`NO_TRACE` does nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..core.config import LeaseConfig
from ..core.events import Release

__all__ = ["NO_TRACE", "TRACE_VERSION", "NoTrace", "TraceWriter", "open_trace", "text"]

#: Version of the trace format, in every header.
TRACE_VERSION = 1


def text(data: bytes) -> str:
    """Notification bytes as JSON-safe text (latin-1: one character per byte)."""
    return data.decode("latin-1")


def _boot_id() -> str | None:
    """This host's boot id: traces with the same one share ``time.monotonic()``."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


class NoTrace:
    """The trace of a worker that writes none: every call does nothing."""

    enabled = False

    def emit(self, ev: str, *, stamp: float | None = None, **fields: Any) -> None:
        """Write one event ``ev`` with ``fields``; ``t`` is ``stamp`` or now."""

    def expire(self, now: float, released: int) -> None:
        """Note an ``expire(now=now)`` call that released ``released`` leases."""

    def release(self, rel: Release, blocks: int) -> None:
        """Note that the worker freed ``blocks`` blocks of ``rel``."""

    def close(self) -> None:
        """Write ``end`` and close the file."""


NO_TRACE = NoTrace()


class TraceWriter(NoTrace):
    """Writes a worker's events as JSON lines to ``path``."""

    enabled = True

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self._fh = open(path, "w", buffering=1, encoding="ascii")  # noqa: SIM115 - close()
        self._idle_expire: float | None = None
        self._dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
        #: events written (the header included)
        self.events = 0
        self.emit("header", v=TRACE_VERSION, **header)

    def emit(self, ev: str, *, stamp: float | None = None, **fields: Any) -> None:
        if self._fh.closed:
            return
        if self._idle_expire is not None:
            now, self._idle_expire = self._idle_expire, None
            self._write({"ev": "expire", "t": now, "now": now, "n": 0})
        self._write({"ev": ev, "t": time.monotonic() if stamp is None else stamp, **fields})

    def _write(self, obj: dict[str, Any]) -> None:
        self._fh.write(self._dumps(obj) + "\n")
        self.events += 1

    def expire(self, now: float, released: int) -> None:
        if released:
            self._idle_expire = None
            self.emit("expire", now=now, n=released)
        else:
            self._idle_expire = now

    def release(self, rel: Release, blocks: int) -> None:
        times = {k: getattr(rel, k) for k in ("at", "granted_at", "deadline", "last_renewal")}
        self.emit("release", req=rel.req_id, reason=rel.reason.value, **times, blocks=blocks)

    def close(self) -> None:
        if not self._fh.closed:
            self.emit("end")
            self._fh.close()


def open_trace(
    path: str | Path | None,
    *,
    role: str,
    engine: str,
    rank: int,
    tp: int,
    agent: str,
    config: LeaseConfig,
    more_config: dict[str, Any] | None = None,
    **extra: Any,
) -> NoTrace:
    """A :class:`TraceWriter` for ``path``, or :data:`NO_TRACE` when it is ``None``.
    ``more_config``: settings the header's ``config`` carries beside the lease
    configuration (the vLLM push connector's ``push_registration_timeout``)."""
    if path is None:
        return NO_TRACE
    header = {
        "role": role,
        "engine": engine,
        "rank": rank,
        "tp": tp,
        "agent": agent,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "config": {**config.as_dict(), **(more_config or {})},
        **extra,
    }
    return TraceWriter(path, header)
