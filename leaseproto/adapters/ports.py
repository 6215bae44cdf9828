"""Free TCP ports for listeners we start ourselves (NIXL's metadata listener, a
vLLM engine's side channel, a worker's sockets).

A port found free by binding to port 0 comes from the kernel's ephemeral range,
the same pool every outgoing connection and every other ``bind(0)`` draws from
(vLLM's ``get_open_port``, ZeroMQ, UCX). Between the pick and the listener's bind,
which may come only after a model has loaded, another process may take it; some
listeners then fail quietly (vLLM 0.32's NIXL side channel hangs its engine:
docs/vllm.md, N2). :func:`free_port` picks from the ports just below that range,
where nothing picks ports on its own, checks that the port binds, and never hands
out the same port twice in one process.
"""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

__all__ = ["PORT_SPAN", "ephemeral_start", "free_port"]

#: how many ports below the ephemeral range :func:`free_port` picks from
PORT_SPAN = 12000
#: fewer candidate ports than this (a range that starts near 1024): ``bind(0)`` instead
_MIN_SPAN = 1000
_TRIES = 1000
_LINUX_DEFAULT = 32768
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_handed: set[int] = set()  # never the same port twice from one process


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where the
    system does not say)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LINUX_DEFAULT


def _bound_port(host: str, port: int) -> int | None:
    """``port`` (the kernel's pick for 0) if it binds on ``host`` now, ``None`` if it
    is in use; any other failure (an address not of this machine) raises."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return None
            raise
        return int(sock.getsockname()[1])


def free_port(host: str = "127.0.0.1", *, rng: random.Random | None = None) -> int:
    """A TCP port that bound on ``host`` a moment ago (``""``: every address), from the
    :data:`PORT_SPAN` ports below the kernel's ephemeral range, not handed out before
    by this process. Another picker may still take it before you bind, but no
    outgoing connection or ``bind(0)`` will. Where the range leaves too few ports
    below it, the kernel's pick (``bind(0)``). Raises :class:`OSError` when no port
    in the span binds after 1000 tries."""
    top = ephemeral_start()
    low = max(1024, top - PORT_SPAN)
    if top - low < _MIN_SPAN:
        port = _bound_port(host, 0)
        if port is None:
            raise OSError(f"no port binds on {host!r}")
        return port
    pick = rng or random.Random()
    for _ in range(_TRIES):
        port = pick.randrange(low, top)
        if port not in _handed and _bound_port(host, port) is not None:
            _handed.add(port)
            return port
    raise OSError(f"no free port in [{low}, {top}) on {host!r} after {_TRIES} tries")
