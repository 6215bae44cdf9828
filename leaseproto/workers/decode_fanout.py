"""Decode rank 0's links to ranks 1, 2, ... (:class:`Followers`, the fan-out
part of :class:`~leaseproto.workers.decode.DecodeWorker`): each follower rank
is its own process (:mod:`.decode_follower`) that reads its share of the heads
from P under its own transfer-done and hands the shard to rank 0.

Rank 0 tells every follower which P ranks to connect to (``connect``), asks
each for its heads of a request (``read``), drops a read it no longer needs
(``abort``), and polls their answers (``read_done`` with the shard,
``read_failed``, and what P said to them: ``nack``, ``lease_lost``,
``peer_lost``), which the scheduler (:mod:`.decode_scheduler`) acts on.
"""

from __future__ import annotations

import time

import zmq

from .decode_state import Req
from .keys import CurveKeys
from .messages import RankParams
from .plane import Msg, Peer

__all__ = ["Followers"]


class Followers:
    """Rank 0's links to ranks 1, 2, ... (in rank order)."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        addresses: list[str],
        *,
        curve: CurveKeys | None = None,
    ) -> None:
        self.peers = [Peer(ctx, a, curve=curve) for a in addresses]
        #: rank -> its NIXL agent (from its ping answer; the router names them to P)
        self.agents: dict[int, str] = {}
        self._pinged = -1e18

    def agent_names(self) -> list[str]:
        """The followers' NIXL agents in rank order, as far as known."""
        return [self.agents[r] for r in self.ranks if r in self.agents]

    def _ping(self) -> None:
        now = time.monotonic()
        if len(self.agents) < len(self.peers) and now - self._pinged >= 0.5:
            self._pinged = now
            for rank, peer in zip(self.ranks, self.peers, strict=True):
                if rank not in self.agents:
                    peer.send({"op": "ping"})

    @property
    def ranks(self) -> range:
        return range(1, len(self.peers) + 1)

    def connect(self, ranks: list[RankParams]) -> None:
        """Start every follower's handshake with these P ranks."""
        for peer in self.peers:
            peer.send({"op": "connect", "ranks": [r.as_msg() for r in ranks]})

    def read(self, req: Req) -> int | None:
        """Ask every follower to read its heads of ``req``; the first rank
        that cannot take the request, or None."""
        msg = {
            "op": "read",
            "req_id": req.req_id,
            "remote_req_id": req.remote_req_id,
            "num_tokens": req.num_tokens,
            "ranks": [r.as_msg() for r in req.ranks],
            "verify": [r.agent for r in req.ranks] if req.verified else [],
        }
        for rank, peer in zip(self.ranks, self.peers, strict=True):
            if not peer.send(msg):
                return rank
        return None

    def abort(self, req_id: str) -> None:
        """Tell every follower to drop its read of ``req_id`` (best effort)."""
        for peer in self.peers:
            peer.send({"op": "abort", "req_id": req_id})

    def poll(self) -> list[tuple[int, Msg | None]]:
        """Answers from the followers as ``(rank, message)``; ``None`` for a
        follower whose connection dropped."""
        self._ping()
        out: list[tuple[int, Msg | None]] = []
        for rank, peer in zip(self.ranks, self.peers, strict=True):
            while (msg := peer.recv()) is not None:
                if msg.get("op") == "pong" and isinstance(msg.get("agent"), str):
                    self.agents[rank] = msg["agent"]
                    continue
                out.append((rank, msg))
            if peer.disconnected():
                out.append((rank, None))
        return out

    def close(self) -> None:
        for peer in self.peers:
            peer.close()
