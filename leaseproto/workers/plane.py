"""The request plane: msgpack messages over ZeroMQ sockets.

Every worker binds one ``ROUTER`` socket; whoever talks to it (the router, a
client, a test) connects a ``DEALER``. A message is one msgpack-encoded map
with an ``"op"`` key. Nothing here blocks the caller's engine loop: receiving
is non-blocking and the loop waits in :meth:`zmq.Poller.poll` with a timeout
it chooses.

With a cluster key (:mod:`.keys`) every socket runs ZeroMQ's CURVE
security: a client without the key completes no handshake, so none of its
messages reaches a worker.

A peer that disconnects is noticed through ZeroMQ's socket monitor
(:meth:`Peer.disconnected`), so the router can fail a request whose worker
died instead of waiting for an answer that will never come.

The requests a worker validates (``generate``, ``prefill``, ``abort``,
``decode`` and its transfer parameters) are typed structs in :mod:`.messages`
(``msgspec``): a bad field is answered with an error naming it. The others
(``ping``, ``stats``, answers) are documented where they are handled:
:mod:`.router`, :mod:`.prefill`, :mod:`.decode`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from .keys import CurveKeys, ZapGuard

__all__ = [
    "BadMessage",
    "Peer",
    "Server",
    "call",
    "decode",
    "encode",
    "send_within",
    "wait_ready",
]

Msg = dict[str, Any]

#: Largest request-plane message accepted, bytes.
MAX_MESSAGE_BYTES = 64 << 20


class BadMessage(ValueError):
    """A request-plane message that is not a msgpack map with a string ``op``."""


#: One msgpack encoder and decoder (msgspec's, as vLLM's NIXL side channel uses): the
#: decoder reads the bytes once, straight into a map with string keys (anything else is
#: refused while decoding); a typed request is then converted from that map by
#: :func:`~leaseproto.workers.messages.parse`, with no second parse of the bytes.
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(dict[str, Any])


def encode(msg: Msg) -> bytes:
    return _ENCODER.encode(msg)


def decode(data: bytes) -> Msg:
    """Parse one message. Raises :class:`BadMessage` and nothing else."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        msg = _DECODER.decode(data)
    except msgspec.ValidationError as exc:  # msgpack, but not a map with string keys
        raise BadMessage(f"expected a map with a string 'op': {exc}") from exc
    except Exception as exc:
        raise BadMessage(f"not msgpack: {exc}") from exc
    if not isinstance(msg.get("op"), str):
        raise BadMessage("expected a map with a string 'op'")
    return msg


def _endpoint(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


class Server:
    """A bound ``ROUTER`` socket: receive requests, reply to their sender."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        host: str,
        port: int,
        *,
        curve: CurveKeys | None = None,
    ) -> None:
        """``curve``: accept only clients that hold the cluster key."""
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.zap = None if curve is None else ZapGuard(ctx, curve)
        if curve is not None:
            curve.server(self.sock)
        if port == 0:
            self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        else:
            self.sock.bind(_endpoint(host, port))
            self.port = port
        self.host = host
        #: messages that could not be parsed (counted and dropped)
        self.bad = 0

    def recv(self) -> tuple[list[bytes], Msg] | None:
        """One pending request (its reply envelope and the message), or ``None``.

        A malformed message is counted in :attr:`bad`, dropped and skipped.
        """
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            if len(frames) < 2:
                self.bad += 1
                continue
            try:
                return frames[:-1], decode(frames[-1])
            except BadMessage:
                self.bad += 1

    def reply(self, envelope: Sequence[bytes], msg: Msg) -> None:
        """Send ``msg`` to the peer of ``envelope``; a peer that left is ignored."""
        with contextlib.suppress(zmq.ZMQError):
            self.sock.send_multipart([*envelope, encode(msg)], zmq.NOBLOCK)

    def close(self) -> None:
        self.sock.close(0)
        if self.zap is not None:
            self.zap.stop()


class Peer:
    """A ``DEALER`` connected to one worker's :class:`Server`.

    :meth:`disconnected` turns ZeroMQ monitor events into a flag: it becomes
    true when the TCP connection to a peer that was connected drops (the
    worker exited or was killed). ZeroMQ reconnects by itself, so a restarted
    worker at the same address is reachable again.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        address: str,
        *,
        curve: CurveKeys | None = None,
    ) -> None:
        self.address = address
        self.sock: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            curve.client(self.sock)
        self.sock.setsockopt(zmq.RECONNECT_IVL, 100)
        self._monitor: zmq.Socket[bytes] = self.sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        )
        self.sock.connect(address)
        self.connected = False
        #: times the connection was lost
        self.drops = 0
        self.bad = 0

    def send(self, msg: Msg) -> bool:
        """Queue ``msg`` without blocking; False when the queue to the peer is
        full (a peer gone for long: ZeroMQ keeps up to its high-water mark)."""
        try:
            self.sock.send(encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(self) -> Msg | None:
        """One pending reply, or ``None``; malformed replies are counted and skipped."""
        while True:
            try:
                data = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return None
            try:
                return decode(data)
            except BadMessage:
                self.bad += 1

    def disconnected(self) -> bool:
        """Drain monitor events; true if the connection dropped since the last call."""
        dropped = False
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return dropped
            if event["event"] == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.connected = False
                self.drops += 1
                dropped = True

    @property
    def monitor(self) -> zmq.Socket[bytes]:
        return self._monitor

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self._monitor.close(0)
        self.sock.close(0)


def send_within(sock: zmq.Socket[bytes], data: bytes, what: str) -> None:
    """``sock.send(data)`` on a DEALER whose ``SNDTIMEO`` is set: a DEALER whose
    handshake a keyed peer refused can block in ``send`` for good (libzmq dropped the
    connection's pipe), so the send waits at most that long.

    Raises:
        TimeoutError: no connection took the message; ``what`` names it.
    """
    try:
        sock.send(data)
    except zmq.Again:
        raise TimeoutError(
            f"could not send {what}: no connection took it within the send timeout"
            " (one the peer refused, or a key it wants)"
        ) from None


def call(
    address: str,
    msg: Msg,
    *,
    timeout: float = 5.0,
    ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
    curve: CurveKeys | None = None,
) -> Msg:
    """Send one request and wait for its reply (for clients, the CLI and tests).
    ``curve``: the cluster's keys (a keyed worker answers nothing without them).

    Raises:
        TimeoutError: no reply within ``timeout`` seconds (the send included: a
            DEALER whose handshake a keyed peer refused can block in ``send`` for
            good, libzmq having dropped the connection's pipe).
    """
    own = ctx is None
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context() if ctx is None else ctx
    sock: zmq.Socket[bytes] = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    deadline = time.monotonic() + timeout
    sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
    if curve is not None:
        curve.client(sock)
    try:
        sock.connect(address)
        send_within(sock, encode(msg), f"{msg.get('op')!r} to {address}")
        left = max(0.0, deadline - time.monotonic())
        if not sock.poll(int(left * 1000), zmq.POLLIN):
            raise TimeoutError(f"no reply from {address} to {msg.get('op')!r} within {timeout:g} s")
        return decode(sock.recv())
    finally:
        sock.close(0)
        if own:
            context.term()


def wait_ready(
    address: str,
    *,
    deadline: float,
    alive: Callable[[], bool] | None = None,
    curve: CurveKeys | None = None,
) -> Msg:
    """Ping ``address`` until it answers or ``deadline`` (``time.monotonic``)
    passes; if ``alive()`` turns false meanwhile, fail at once.

    Raises:
        TimeoutError: no answer by the deadline.
        RuntimeError: the process serving ``address`` exited.
    """
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{address} did not answer before the deadline")
        try:
            return call(address, {"op": "ping"}, timeout=min(0.5, remaining), curve=curve)
        except TimeoutError:
            pass
        if alive is not None and not alive():
            raise RuntimeError(f"the process serving {address} exited")
