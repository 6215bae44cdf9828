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

from typing import Any

import zmq
from vllm.utils.network_utils import make_zmq_path

__all__ = ["SideChannelCheck", "SideChannelPortTaken", "check_side_channel"]


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
    starts its listener (once, as vLLM starts it once)."""

    side_channel_host: str
    side_channel_port: int
    _nixl_handshake_listener_t: Any

    def set_xfer_handshake_metadata(self, metadata: Any) -> None:
        if self._nixl_handshake_listener_t is None:
            check_side_channel(self.side_channel_host, self.side_channel_port)
        super().set_xfer_handshake_metadata(metadata)  # type: ignore[misc]
