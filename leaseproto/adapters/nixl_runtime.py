"""Loading NIXL, and what it does on this path, for :mod:`leaseproto.adapters.nixl`.

How NIXL behaves here (nixl-cu12 1.5.1, checked on this machine, CPU only);
"the endpoint" is :class:`leaseproto.adapters.nixl.NixlEndpoint`:

* Metadata exchange is one-way: ``fetch_remote_metadata`` loads the *peer's*
  metadata into us and returns at once (the answer arrives on the listener
  thread; ``check_remote_metadata`` turns true about 0.1 s later on loopback).
  The endpoint's ``connect`` therefore also pushes our metadata to the peer
  (``send_local_metadata``), so the peer can notify us back (P's nacks to D)
  without connecting itself. Both agents need a listener, which every endpoint
  has.
* A fetch from an address where nobody listens fails silently (NIXL only logs
  it) and is never retried by NIXL. The endpoint re-issues it after
  ``connect_retry`` seconds, doubling the wait up to 2 s, until
  ``connect_timeout``; then the peer is lost with reason ``"connect timeout"``.
  So a D started before its P still connects. Duplicate fetches are harmless.
* The metadata a peer holds is a snapshot, and the listener is up before the
  constructor returns, so a peer may fetch it before ``register``. A READ
  whose remote memory the loaded metadata does not cover
  (``check_remote_metadata(peer, descs)`` is false) re-fetches it and stays
  ``"PROC"`` until it does (then it is posted) or ``connect_timeout`` passes
  (then ``"ERR"``, e.g. a layout naming memory the peer never registered).
  Registering later also re-pushes our metadata to peers we connected to.
* A ``port`` already in use: the constructor raises ``RuntimeError`` ("Failed
  to bind metadata listener socket").
* ``send_notif`` to a peer whose process died raises
  ``nixlRemoteDisconnectError`` (at once, on loopback); to a peer we have no
  metadata for it raises ``nixlNotFoundError``. ``check_remote_metadata`` stays
  true for a dead peer, so the endpoint keeps its own ``lost`` state; a peer
  is marked lost only on a disconnect (or a connect timeout), never on other
  errors. ``connect`` again clears it (e.g. a restarted peer).
* A READ posted to a dead peer raises from ``transfer`` (``postXferReq``); the
  endpoint returns a :class:`Transfer` already in state ``"ERR"``.
* The notification attached to a READ (``notif_msg``) is delivered to the
  *target* (the peer whose memory was read) once the data has moved; the
  initiator sees ``"DONE"`` from :meth:`~leaseproto.adapters.nixl.NixlEndpoint.transfer_state`.
* Messages of 1 MiB arrive intact over UCX on loopback.
* NIXL's C++ logging (connection refused while a peer starts, disconnects)
  goes to stderr; ``NIXL_LOG_LEVEL=WARN|ERROR|FATAL`` in the environment
  quiets it (read when NIXL loads).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from .ports import free_port

__all__ = [
    "INSTALL_HINT",
    "MAX_RETRY_DELAY",
    "ConnState",
    "EndpointClosed",
    "EndpointStats",
    "check_port",
    "describe",
    "free_port",
    "is_disconnect",
    "load_nixl",
]

INSTALL_HINT = "pip install leaseproto[nixl]"
ConnState = Literal["unknown", "connecting", "connected", "failed", "lost"]
#: Longest wait between two metadata fetches while connecting (the first wait
#: is ``connect_retry``; each retry doubles it).
MAX_RETRY_DELAY = 2.0


def load_nixl() -> ModuleType:
    """Import the NIXL Python API: ``nixl`` (the meta-package, which picks a
    CUDA variant from torch and, with a CPU torch, falls back to whichever
    variant is installed) or else ``nixl_cu12``.
    Raises ``ImportError`` naming ``pip install leaseproto[nixl]`` when neither
    imports."""
    problems: list[str] = []
    for name in ("nixl", "nixl_cu12"):
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if hasattr(module, "nixl_agent") and hasattr(module, "nixl_agent_config"):
            return module
        problems.append(f"{name}: has no nixl_agent")
    raise ImportError(
        f"NIXL is not importable ({'; '.join(problems)}); install it with `{INSTALL_HINT}`"
    )


class EndpointClosed(RuntimeError):
    """The endpoint was used after :meth:`NixlEndpoint.close`."""


@dataclass(slots=True)
class EndpointStats:
    """Counters since the endpoint was made (read them; do not write)."""

    sent: int = 0
    send_failed: int = 0
    received: int = 0
    poll_failed: int = 0
    connects: int = 0
    connect_retries: int = 0
    peers_lost: int = 0
    reads_started: int = 0
    reads_done: int = 0
    reads_failed: int = 0
    release_failed: int = 0
    #: metadata pushed to us under a name we never fetched from its address,
    #: removed (``accept_pushed=False``)
    pushes_refused: int = 0
    #: metadata loaded under a peer's name that does not cover the memory the
    #: peer said it serves (a squatter's, or a snapshot from before it
    #: registered), removed and fetched again
    names_refetched: int = 0
    #: peers dropped with :meth:`~leaseproto.adapters.nixl.NixlEndpoint.forget`
    forgotten: int = 0
    #: our metadata pushed again to a peer after ``repush_idle`` without traffic
    repushes: int = 0
    #: the last transport error, in words (for logs)
    last_error: str = ""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def is_disconnect(exc: BaseException) -> bool:
    return type(exc).__name__ == "nixlRemoteDisconnectError"


def check_port(port: object) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
