"""READs for :class:`~leaseproto.adapters.nixl.NixlEndpoint`: posting them (or
holding them until the peer's metadata covers the memory), their state, and
releasing NIXL's handles. A transport failure becomes a :class:`Transfer` in
state ``"ERR"``, never an exception in the engine loop.
"""

from __future__ import annotations

import time
from typing import Any

from .nixl_runtime import ConnState, EndpointStats, describe
from .xfer import Transfer, XferDescs, XferState, check_pair

__all__ = ["EndpointReads"]


class EndpointReads:
    """The READ half of an endpoint; the endpoint supplies its agent, peers and
    connection handling (declared below)."""

    _agent: Any
    stats: EndpointStats
    connect_timeout: float

    def _live(self) -> Any:
        raise NotImplementedError

    def _peer_state(self, peer: str) -> ConnState | None:
        raise NotImplementedError

    def peer_lost(self, peer: str) -> bool:
        raise NotImplementedError

    def _refetch(self, peer: str) -> None:
        raise NotImplementedError

    def _failed(self, peer: str, exc: BaseException) -> None:
        raise NotImplementedError

    def _repush_if_idle(self, peer: str) -> None:
        raise NotImplementedError

    # -- transfers ------------------------------------------------------------

    def read(self, peer: str, local: XferDescs, remote: XferDescs, *, notif_msg: bytes) -> Transfer:
        """READ ``remote`` (memory ``peer`` registered) into ``local`` (ours),
        row by row; NIXL delivers ``notif_msg`` to ``peer`` once the data has
        moved. Never raises a transport error: a failure to start gives a
        :class:`Transfer` already in state ``"ERR"``."""
        agent = self._live()
        check_pair(local, remote)
        if not isinstance(notif_msg, (bytes, bytearray)):
            raise TypeError(f"notif_msg must be bytes, got {type(notif_msg).__name__}")
        msg = bytes(notif_msg)
        state = self._peer_state(peer)  # advances a pending connect
        if state is not None and state != "connected":
            self.stats.reads_failed += 1
            return Transfer(
                peer, msg, local.nbytes, handle=None, state="ERR", error=f"peer is {state}"
            )
        self._repush_if_idle(peer)  # its notification must reach a peer that knows us
        xfer = Transfer(peer, msg, local.nbytes, handle=None, state="PROC")
        xfer._started = time.monotonic()
        self.stats.reads_started += 1
        try:
            ldescs = agent.get_xfer_descs(list(local.descs), local.mem_type)
            rdescs = agent.get_xfer_descs(list(remote.descs), remote.mem_type)
            known = bool(agent.check_remote_metadata(peer, rdescs))
        except Exception as exc:
            self._fail_xfer(xfer, exc)
            return xfer
        xfer._pending = (ldescs, rdescs)
        if known:
            self._post(xfer)
        else:  # metadata from before the peer registered this memory: refresh it
            self._refetch(peer)
        return xfer

    def transfer_state(self, xfer: Transfer) -> XferState:
        """``"DONE"``, ``"PROC"`` or ``"ERR"`` (final states stick)."""
        agent = self._live()
        if xfer._state != "PROC":
            return xfer._state
        if xfer._pending is not None:
            self._advance_pending(xfer)
            return xfer._state
        try:
            state: XferState = agent.check_xfer_state(xfer._handle)
        except Exception as exc:
            self._fail_xfer(xfer, exc)
            return "ERR"
        self._settle(xfer, state, "transfer reported ERR")
        return state

    def release(self, xfer: Transfer) -> None:
        """Free NIXL's handle (NIXL tries to cancel a transfer still in
        progress; one still waiting for metadata is never posted). A transfer
        released before it finished reads ``"ERR"``. Safe to call twice."""
        self._live()
        xfer._pending = None
        if xfer._handle is not None:
            handle, xfer._handle = xfer._handle, None
            self._release_handle(handle)
        if xfer._state == "PROC":
            xfer._state = "ERR"
            xfer.error = "released before it finished"

    def _post(self, xfer: Transfer) -> None:
        assert xfer._pending is not None
        ldescs, rdescs = xfer._pending
        xfer._pending = None
        try:
            xfer._handle = self._agent.initialize_xfer(
                "READ", ldescs, rdescs, xfer.peer, xfer.notif_msg
            )
            state: XferState = self._agent.transfer(xfer._handle)
        except Exception as exc:
            self._fail_xfer(xfer, exc)
            return
        self._settle(xfer, state, "posting the transfer returned ERR")

    def _advance_pending(self, xfer: Transfer) -> None:
        assert xfer._pending is not None
        peer = xfer.peer
        if self.peer_lost(peer):
            xfer._pending = None
            self._settle(xfer, "ERR", f"peer {peer} lost before the read was posted")
        elif self._agent.check_remote_metadata(peer, xfer._pending[1]):
            self._post(xfer)
        elif time.monotonic() - xfer._started >= self.connect_timeout:
            xfer._pending = None
            self._settle(
                xfer,
                "ERR",
                f"{peer} has not registered the memory to read "
                f"(no metadata covers it after {self.connect_timeout:g} s)",
            )
        else:
            self._refetch(peer)

    def _settle(self, xfer: Transfer, state: XferState, error: str) -> None:
        xfer._state = state
        if state == "DONE":
            self.stats.reads_done += 1
        elif state == "ERR":
            self.stats.reads_failed += 1
            xfer.error = xfer.error or error
            if xfer._handle is not None:
                handle, xfer._handle = xfer._handle, None
                self._release_handle(handle)

    def _fail_xfer(self, xfer: Transfer, exc: BaseException) -> None:
        self._failed(xfer.peer, exc)
        xfer.error = describe(exc)
        self._settle(xfer, "ERR", xfer.error)

    def _release_handle(self, handle: Any) -> None:
        try:
            handle.release()
        except Exception as exc:
            self.stats.release_failed += 1
            self.stats.last_error = f"releasing a transfer: {describe(exc)}"
