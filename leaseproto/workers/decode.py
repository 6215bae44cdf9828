"""Decode rank 0 as a process: its request plane, metrics and loop
(:class:`DecodeWorker`). Ranks 1.. read their share of the heads and hand it
over (:mod:`.decode_follower`).

The worker owns its parts, each holding its own state and passed what it
needs: the leases D holds at P (``leases``, :mod:`.decode_leases`), the P
agents whose reads it verifies (``verification``, :mod:`.decode_verification`),
its reads of P (``reads``, :mod:`.decode_reads`), ranks 1.. (``followers``,
:mod:`.decode_fanout`), the cached turns it grants (``turns``,
:mod:`.decode_turns`), the model's tokens and the router's answers
(``output``, :mod:`.decode_output`), and the requests themselves
(``scheduler``): one request's path through D, from its arrival to its
answer, is walked in one place, :mod:`.decode_scheduler`.

One single-threaded loop turn (:meth:`DecodeWorker.step`): wait briefly for
the request plane (less while a read or a verdict is outstanding), take its
``decode`` and ``abort`` requests, then ``scheduler.advance``: what ranks 1..
and P said, heartbeats, reads and verdicts, scheduling, one decode step.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import zmq

from ..core.tracker import HeartbeatTracker
from .backend import KVBackend
from .decode_fanout import Followers
from .decode_leases import PLeases
from .decode_output import Output
from .decode_reads import PReads
from .decode_scheduler import DecodeScheduler
from .decode_state import DecodeOptions, Reporting
from .decode_turns import TurnGrants
from .decode_verification import Verification
from .keys import curve
from .loop import IDLE_WAIT_S, PENDING_WAIT_S, EngineLoop, wait_for_input
from .metrics import DecodeMetrics, stats_dict
from .notifications import DropLog, NotificationGate
from .plane import Msg, Server

__all__ = ["DecodeOptions", "DecodeWorker"]

log = logging.getLogger("leaseproto.decode")


class DecodeWorker(EngineLoop):
    """Decode rank 0: schedules, heartbeats and decodes."""

    def __init__(self, opts: DecodeOptions, *, backend: KVBackend | None = None) -> None:
        """``backend``: a stand-in for a new :class:`KVBackend` (tests)."""
        opts.validate()
        self.opts = opts
        self.backend = backend or KVBackend(
            opts, agent_name=f"decode-r0-{secrets.token_hex(3)}", role="decode", full_heads=True
        )
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        keys = curve(opts.cluster_key)
        self.server = Server(self.ctx, opts.host, opts.port, curve=keys)
        # the leases' heartbeat tracker, made first: the metrics read it from their start
        tracker = HeartbeatTracker(opts.config)
        self.metrics = DecodeMetrics(opts.engine_id, opts.rank, tracker_stats=lambda: tracker.stats)
        if opts.metrics_port is not None:
            self.metrics.serve(opts.host, opts.metrics_port)
        # drops: what was refused; notes: the other lines a peer or client can trigger
        self.out = Reporting(self.metrics, DropLog(log), DropLog(log, prefix="", max_detail=480))
        self.gate = NotificationGate(
            self.out.drops, max_bytes=opts.max_notification_in, known=self.backend.is_connected
        )
        # the parts
        self.followers = Followers(self.ctx, opts.followers, curve=keys)
        self.leases = PLeases(opts, self.backend, self.out, tracker)
        self.verification = Verification(opts, self.backend, self.out)
        self.reads = PReads(opts, self.backend, self.followers, self.out)
        #: D as a grantor: cached turns under leases P reads (issue 18)
        self.turns = TurnGrants(opts, self.backend, self.gate, self.metrics)
        #: the model's tokens and the router's answers
        self.output = Output(opts, self.backend, self.server, self.out, self.turns)
        self.scheduler = DecodeScheduler(
            opts,
            self.backend,
            self.out,
            self.gate,
            leases=self.leases,
            verification=self.verification,
            reads=self.reads,
            followers=self.followers,
            turns=self.turns,
            output=self.output,
        )

    def _request(self, envelope: list[bytes], msg: Msg) -> None:
        op = msg["op"]
        if op == "decode":
            self.scheduler.intake(envelope, msg)
        elif op == "abort":
            self.scheduler.abort(msg.get("req_id"))
        elif not self.common_op(envelope, msg):
            self.out.malformed(f"unknown op {op!r}")
            self.server.reply(envelope, {"op": "error", "error": f"unknown op {op!r}"})

    def step(self, wait_s: float | None = None) -> None:
        states = {r.state for r in self.scheduler.running.values()}
        pending = bool(states & {"reading", "verifying"})
        if wait_s is None:  # short while a read or its verdict is outstanding
            wait_s = PENDING_WAIT_S if pending else IDLE_WAIT_S
        if wait_s > 0 and "decoding" not in states:
            # a read outstanding: its verdict (or our READ's progress) ends the wait
            wait_for_input(self.server.sock, wait_s, self.backend.endpoint if pending else None)
        while (got := self.server.recv()) is not None:
            self._request(*got)
        if self.server.bad:
            self.out.malformed(f"{self.server.bad} unparsable request-plane messages")
            self.server.bad = 0
        self.scheduler.advance()
        self.metrics.waiting.set(len(self.scheduler.waiting))
        self.metrics.running.set(len(self.scheduler.running))

    def ready_info(self) -> dict[str, Any]:
        return {
            "role": "decode",
            "host": self.opts.host,
            "port": self.server.port,
            "metrics_port": self.metrics.port,
            "nixl_port": self.backend.nixl_port,
            "agent": self.backend.agent_name,
            "rank": 0,
            "tp": self.opts.tp,
        }

    def pong(self) -> Msg:
        return {
            "role": "decode",
            "tp": self.opts.tp,
            "agent": self.backend.agent_name,
            # every rank's NIXL agent, as far as known: the router names them to P
            "agents": [self.backend.agent_name, *self.followers.agent_names()],
            "limits": self.backend.limits(),
        }

    def stats(self) -> Msg:
        return {
            "role": "decode",
            "waiting": len(self.scheduler.waiting),
            "running": len(self.scheduler.running),
            "tracked": len(self.leases.tracker),
            "blocks_free": self.backend.num_free,
            **self.out.counts,
            "oversized": self.gate.oversized,
            "unknown_sender": self.gate.unknown_sender,
            # names bound to addresses (adapters/nixl.py)
            "pushes_refused": self.backend.endpoint.stats.pushes_refused,
            "names_refetched": self.backend.endpoint.stats.names_refetched,
            "tracker": stats_dict(self.leases.tracker.stats),
            **self.turns.stats(),
            **self.backend.auth_stats(),
        }

    def describe(self) -> str:
        o = self.opts
        return (
            f"decode rank 0/{o.tp} serving on {o.host}:{self.server.port} (NIXL "
            f"{self.backend.nixl_port}, agent {self.backend.agent_name}, policy "
            f"{o.policy}, max running {o.max_running})"
        )

    def close(self) -> None:
        self.followers.close()
        self.server.close()
        self.turns.close()
        self.backend.close()
        self.ctx.term()
