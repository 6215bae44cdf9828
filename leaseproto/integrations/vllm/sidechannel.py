"""NIXL's side channel, bound where the engine can report it.

vLLM 0.32's NIXL scheduler serves its handshake metadata from a ZeroMQ ROUTER socket that
a listener thread binds on ``VLLM_NIXL_SIDE_CHANNEL_PORT``, while the engine's start-up
waits for that thread's ready event without a timeout. When the port is taken the bind
raises in the thread, the event is never set, and the engine hangs: neither serving nor
exiting, with the cause only in a thread's traceback (found here: a port picked free, and
taken by another process while the model loaded). The connector's schedulers bind the same
address first, in the engine's own thread, and refuse to start with
:class:`SideChannelPortTaken` when they cannot; the listener binds it a moment later.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq
from vllm.utils.network_utils import make_zmq_path

__all__ = ["SideChannelCheck", "SideChannelPortTaken", "check_side_channel"]

logger = logging.getLogger("vllm.leaseproto.scheduler")
_MISSING: Any = object()  # an attribute this vLLM's scheduler does not have
_warned: set[type] = set()  # the scheduler classes the skipped check was logged for


class SideChannelPortTaken(OSError):
    """The NIXL side channel's address cannot be bound (another process holds the port).
    Its message names the address and the setting to change."""


def check_side_channel(host: str, port: int) -> None:
    """Bind and release the ROUTER socket vLLM's listener binds; raise
    :class:`SideChannelPortTaken` where that fails."""
    path = make_zmq_path("tcp", host, port)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.bind(path)
        except zmq.ZMQError as e:
            raise SideChannelPortTaken(
                e.errno,
                f"NIXL side channel {path}: {e.strerror}; free the port or set "
                "VLLM_NIXL_SIDE_CHANNEL_PORT (vLLM itself would wait for its listener forever)",
            ) from e
    finally:
        ctx.destroy(linger=0)


class SideChannelCheck:
    """Mixed into a NIXL connector scheduler: the side channel is checked before vLLM
    starts its listener (once, as vLLM starts it once). The check reads three private
    attributes of vLLM 0.32's scheduler; where a vLLM lacks one of them, the check is
    skipped (logged once per class) and the scheduler behaves as vLLM's own."""

    def set_xfer_handshake_metadata(self, metadata: Any) -> None:
        listener = getattr(self, "_nixl_handshake_listener_t", _MISSING)
        host = getattr(self, "side_channel_host", _MISSING)
        port = getattr(self, "side_channel_port", _MISSING)
        if listener is _MISSING or host is _MISSING or port is _MISSING:
            if type(self) not in _warned:
                _warned.add(type(self))
                logger.warning(
                    "leaseproto: this vLLM's NIXL scheduler has no %s; the side-channel "
                    "port is not checked before its listener binds it",
                    ", ".join(
                        name
                        for name, got in (
                            ("_nixl_handshake_listener_t", listener),
                            ("side_channel_host", host),
                            ("side_channel_port", port),
                        )
                        if got is _MISSING
                    ),
                )
        elif listener is None:
            check_side_channel(host, port)
        super().set_xfer_handshake_metadata(metadata)  # type: ignore[misc]
