"""A client of the router that submits many requests without blocking and
collects the answers (``leaseproto generate``, :mod:`.cluster`, ``leaseproto
demo`` and the tests)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import zmq

from ..workers.keys import CurveKeys
from ..workers.plane import Msg, decode, encode, send_within

__all__ = ["RouterClient"]


class RouterClient:
    """Submit many requests to the router without blocking; collect answers."""

    def __init__(
        self, address: str, *, curve: CurveKeys | None = None, send_timeout: float = 5.0
    ) -> None:
        """``curve``: the cluster's keys, for a router that has one. ``send_timeout``:
        how long :meth:`submit` may wait for the socket to take a request."""
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock: zmq.Socket[bytes] = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDTIMEO, max(1, int(send_timeout * 1000)))
        if curve is not None:
            curve.client(self.sock)
        self.sock.connect(address)
        self.results: dict[Any, Msg] = {}
        self.sent: dict[Any, float] = {}

    def submit(
        self,
        req_id: str,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        conversation: str | None = None,
    ) -> None:
        """``conversation``: this request is a turn of that conversation (its
        prompt: the conversation so far plus the new tokens); D keeps the turn's
        KV and the next turn reads it as its prefix."""
        msg: Msg = {"op": "generate", "id": req_id, "prompt": list(prompt)}
        msg["max_tokens"] = max_tokens
        if conversation is not None:
            msg["conversation"] = conversation
        send_within(self.sock, encode(msg), f"request {req_id!r} to the router")
        self.sent[req_id] = time.monotonic()

    def poll(self, timeout: float = 0.0) -> list[Msg]:
        """Answers that arrived within ``timeout`` seconds (at least one wait)."""
        out: list[Msg] = []
        if self.sock.poll(int(timeout * 1000), zmq.POLLIN):
            while True:
                try:
                    msg = decode(self.sock.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if msg.get("op") == "result":
                    sent = self.sent.get(msg.get("id"))
                    msg["_latency"] = None if sent is None else time.monotonic() - sent
                    self.results[msg.get("id")] = msg
                    out.append(msg)
        return out

    def wait_all(self, *, deadline: float) -> dict[Any, Msg]:
        """Wait until every submitted request has an answer or ``deadline``
        (``time.monotonic``) passes; returns the answers so far."""
        while len(self.results) < len(self.sent):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.poll(min(left, 0.2))
        return self.results

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()
