"""NIXL transfer descriptors and READ handles, shared by the endpoint
(:mod:`leaseproto.adapters.nixl`) and the block pool
(:mod:`leaseproto.adapters.kv_pool`). Plain data: importing this module
imports neither NIXL nor torch.

Interface::

    XferDescs(mem_type: "DRAM"|"VRAM", descs: tuple[tuple[addr, nbytes, device], ...])
      .nbytes -> int, len(x)
    Transfer                      # made by NixlEndpoint.read, never by hand
      .peer, .notif_msg, .nbytes, .error (str), .state -> "DONE"|"PROC"|"ERR"
    check_pair(local, remote)     # ValueError unless the lists pair up row by row
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["MEM_TYPES", "Transfer", "XferDescs", "XferState", "check_pair"]

XferState = Literal["DONE", "PROC", "ERR"]
MEM_TYPES = ("DRAM", "VRAM")


@dataclass(frozen=True, slots=True)
class XferDescs:
    """A NIXL transfer descriptor list: ``(address, nbytes, device_id)`` rows
    in one memory type (``"DRAM"`` or ``"VRAM"``)."""

    mem_type: str
    descs: tuple[tuple[int, int, int], ...]

    def __post_init__(self) -> None:
        if self.mem_type not in MEM_TYPES:
            raise ValueError(f"mem_type must be one of {MEM_TYPES}, got {self.mem_type!r}")
        for row in self.descs:
            if len(row) != 3 or any(not isinstance(x, int) or x < 0 for x in row):
                raise ValueError(f"descriptor {row!r} is not (addr, nbytes, device) of ints >= 0")

    @property
    def nbytes(self) -> int:
        return sum(row[1] for row in self.descs)

    def __len__(self) -> int:
        return len(self.descs)


class Transfer:
    """One READ started by :meth:`NixlEndpoint.read`. Poll it with
    :meth:`NixlEndpoint.transfer_state`; hand it to :meth:`NixlEndpoint.release`
    when done (or abandoned)."""

    __slots__ = (
        "_handle",
        "_pending",
        "_started",
        "_state",
        "error",
        "nbytes",
        "notif_msg",
        "peer",
    )

    def __init__(
        self,
        peer: str,
        notif_msg: bytes,
        nbytes: int,
        *,
        handle: Any,
        state: XferState,
        error: str = "",
    ) -> None:
        self.peer = peer
        self.notif_msg = notif_msg
        self.nbytes = nbytes
        #: why the transfer failed, in words ("" unless the state is ERR)
        self.error = error
        self._handle = handle
        self._state: XferState = state
        # (local, remote) NIXL lists while waiting for the peer's metadata to
        # cover the remote memory; posted by transfer_state once it does
        self._pending: tuple[Any, Any] | None = None
        self._started = 0.0

    @property
    def state(self) -> XferState:
        """The state last observed (``transfer_state`` refreshes it)."""
        return self._state

    def __repr__(self) -> str:
        return f"Transfer(peer={self.peer!r}, state={self._state}, nbytes={self.nbytes})"


def check_pair(local: XferDescs, remote: XferDescs) -> None:
    """Raise ``ValueError`` unless ``local`` and ``remote`` are non-empty and
    pair up row by row (same count, same byte length per row)."""
    if not local.descs:
        raise ValueError(
            "a READ needs at least one descriptor (send a plain notification "
            "when there is nothing to read)"
        )
    if len(local) != len(remote):
        raise ValueError(
            f"descriptor lists differ in length: {len(local)} local, {len(remote)} remote"
        )
    for i, (lrow, rrow) in enumerate(zip(local.descs, remote.descs, strict=True)):
        if lrow[1] != rrow[1]:
            raise ValueError(f"descriptor {i}: local {lrow[1]} bytes, remote {rrow[1]} bytes")
