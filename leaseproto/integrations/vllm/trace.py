"""Event traces of :class:`~leaseproto.integrations.vllm.LeaseprotoConnector`
(``kv_connector_extra_config: {"trace_dir": DIR}``). No vLLM import.

Each connector worker (one per engine and TP rank) writes one file in ``DIR``,
``<role>-<engine>-rank<r>-<pid>.jsonl``, in the format of our workers' traces
(:mod:`leaseproto.adapters.trace_writer`), so ``leaseproto check-trace DIR/*``
validates a real vLLM P/D run as it does ours:

* both sides: ``recv`` (every notification NIXL delivered, as plaintext),
  ``send`` (every notification sent, vLLM's own included: the agent is
  wrapped by :class:`TracedNixl`), ``read`` (a READ and the transfer-done NIXL
  delivers after it), ``write`` (push mode: a WRITE and its completion);
* P: ``grant``, ``handle``, ``renew``, ``expire``, ``release``, ``abort_req``,
  ``forget``, as the prefill worker writes them. A grant's ``lease`` is the
  time left on the worker clock; ``rebased: true`` says the lease was stamped
  earlier, by vLLM's scheduler when the request finished prefill (vLLM's
  ``request_finished``), so the rest of the initial lease is granted (B3);
* D: ``use`` (``req``, ``remote``, ``ok_from``) when a verified READ is
  reported to vLLM's scheduler.

Off without ``trace_dir``: :data:`~leaseproto.adapters.trace_writer.NO_TRACE`
does nothing, and the agent is not wrapped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from leaseproto import LeaseConfig
from leaseproto.adapters.trace_writer import NO_TRACE, NoTrace, open_trace, text

from .verify import agent_name

__all__ = ["TRACE_DIR_KEY", "TracedNixl", "open_connector_trace", "trace_dir"]

#: The ``kv_connector_extra_config`` key naming the directory traces go to.
TRACE_DIR_KEY = "trace_dir"


def trace_dir(extra: Any) -> Path | None:
    """The trace directory ``kv_connector_extra_config`` names, or None.

    Raises:
        ValueError: the value is not a non-empty string.
    """
    if not isinstance(extra, dict) or extra.get(TRACE_DIR_KEY) in (None, ""):
        return None
    value = extra[TRACE_DIR_KEY]
    if not isinstance(value, str):
        raise ValueError(f"{TRACE_DIR_KEY}={value!r} must be a directory path (a string)")
    return Path(value)


def open_connector_trace(
    extra: Any,
    *,
    producer: bool,
    engine: str,
    rank: int,
    tp: int,
    agent: str,
    config: LeaseConfig,
    trace_config: dict[str, Any] | None = None,
) -> NoTrace:
    """This worker's trace in ``trace_dir`` (created), or NO_TRACE without one.
    ``trace_config``: settings beside ``config`` the header's ``config`` carries
    (push mode: ``push_registration_timeout``, the initial lease of D's grants).

    Raises:
        ValueError: ``trace_dir`` is not a string.
        OSError: the directory or the file cannot be made.
    """
    where = trace_dir(extra)
    if where is None:
        return NO_TRACE
    role = "prefill" if producer else "decode"
    where.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in engine)
    path = where / f"{role}-{safe}-rank{rank}-{os.getpid()}.jsonl"
    return open_trace(
        path,
        role=role,
        engine=engine,
        rank=rank,
        tp=tp,
        agent=agent,
        config=config,
        policy="lease",
        more_config=trace_config,
        verify_reads=True,
        connector="LeaseprotoConnector",
    )


class TracedNixl:
    """vLLM's NIXL agent (or :class:`~.sealing.SealedNixl` around it) with every
    notification sent and received written to ``trace``. ``read_to`` names the
    P agent of the READ being posted (set by the worker around vLLM's
    ``_read_blocks``): its ``notif_msg`` is the transfer-done of a ``read``
    (``xfer_ev``: ``write`` for push mode's WRITE and its completion)."""

    def __init__(self, inner: Any, trace: NoTrace) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "trace", trace)
        object.__setattr__(self, "read_to", None)
        object.__setattr__(self, "xfer_ev", "read")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("inner", "trace", "read_to", "xfer_ev"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def send_notif(self, remote_agent_name: str | bytes, notif_msg: bytes, **kw: Any) -> None:
        ok, sent_at = False, time.monotonic()  # the peer may have it before send_notif returns
        try:
            self.inner.send_notif(remote_agent_name, notif_msg=notif_msg, **kw)
            ok = True
        finally:
            to, data = agent_name(remote_agent_name), text(bytes(notif_msg))
            self.trace.emit("send", stamp=sent_at, to=to, data=data, ok=ok)

    def get_new_notifs(self) -> dict[Any, list[bytes]]:
        got: dict[Any, list[bytes]] = self.inner.get_new_notifs()
        for agent, notifs in got.items():
            for raw in notifs:
                self.trace.emit("recv", src=agent_name(agent), data=text(bytes(raw)))
        return got

    def make_prepped_xfer(self, *args: Any, **kw: Any) -> Any:
        made_at = time.monotonic()  # the READ, and its transfer-done, may go at once
        handle = self.inner.make_prepped_xfer(*args, **kw)
        msg = kw.get("notif_msg")
        if msg and self.read_to is not None:
            self.trace.emit(self.xfer_ev, stamp=made_at, to=self.read_to, data=text(bytes(msg)))
        return handle
