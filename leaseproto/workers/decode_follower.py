"""Decode rank 1, 2, ...: reads its share of the heads from P and hands it to
rank 0, which runs the model.

Each rank is a consumer of P's lease: its READ carries its own transfer-done
notification, so a P rank read by two D ranks waits for two (``consumers``).
NACKs and lost P peers are forwarded to rank 0, which owns the scheduler and
the heartbeats. One single-threaded loop, like every worker.

Request-plane ops (from rank 0): ``connect {ranks}`` starts the handshake
with P's ranks; ``read {req_id, remote_req_id, num_tokens, ranks, verify}``
reads this rank's heads and answers ``read_done {req_id, kv}`` (the shard's
bytes) or ``read_failed {req_id, error}``; ``abort {req_id}`` drops that read
unfinished and unanswered (rank 0 no longer needs it).

A read waits for the verdict of every P agent in ``verify`` (rank 0's
decision for the request) and of every agent that ever answered this rank's
hello: as on rank 0, a message can turn verification on, never off.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..adapters.xfer import Transfer
from ..core import wire
from . import verdicts
from .backend import KVBackend
from .decode_state import DecodeOptions, hello, verdict_wait
from .keys import curve
from .loop import IDLE_WAIT_S, PENDING_WAIT_S, EngineLoop, wait_for_input
from .messages import RankParams, parse
from .metrics import DecodeMetrics
from .notifications import DropLog, NotificationGate
from .plane import Msg, Server

__all__ = ["DecodeFollower"]


def _msg_id(msg: wire.Message) -> str | None:
    return getattr(msg, "req_id", None)


log = logging.getLogger("leaseproto.decode")

#: Seconds a READ may stay in progress before it counts as failed.
_READ_TIMEOUT_S = 30.0


@dataclass
class _Read:
    envelope: list[bytes]
    req_id: str
    num_tokens: int
    blocks: list[int]
    started: float
    remote: str = ""
    transfers: list[Transfer] = field(default_factory=list)
    #: P agents whose verdict is still awaited (reads of a P that advertised)
    verdicts_due: set[str] = field(default_factory=set)
    verify_by: float = 0.0
    error: str | None = None
    #: every P agent whose OK this read waits for (for the trace)
    ok_from: set[str] = field(default_factory=set)


class DecodeFollower(EngineLoop):
    """Decode rank ``rank`` > 0 of a ``tp``-rank engine."""

    def __init__(self, opts: DecodeOptions, *, backend: KVBackend | None = None) -> None:
        """``backend``: as for :class:`~.decode.DecodeWorker`."""
        opts.validate()
        self.opts = opts
        self.backend = backend or KVBackend(
            opts, agent_name=f"decode-r{opts.rank}-{secrets.token_hex(3)}", role="decode"
        )
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.server = Server(self.ctx, opts.host, opts.port, curve=curve(opts.cluster_key))
        self.metrics = DecodeMetrics(opts.engine_id, opts.rank)
        if opts.metrics_port is not None:
            self.metrics.serve(opts.host, opts.metrics_port)
        self.reads: dict[str, _Read] = {}
        self.waiting: list[tuple[list[bytes], Msg]] = []  # reads waiting for blocks
        self.leader: list[bytes] | None = None
        self.counts = {"reads_done": 0, "reads_failed": 0, "nacks": 0, "malformed": 0}
        self.verified_agents: set[str] = set()  # P ranks that advertised verdicts
        self.acked: set[str] = set()  # ... and acknowledged ours
        self.hello_sent: dict[str, float] = {}
        self.drops = DropLog(log)
        self.gate = NotificationGate(
            self.drops, max_bytes=opts.max_notification_in, known=self.backend.is_connected
        )

    def ready_info(self) -> dict[str, Any]:
        return {
            "role": "decode",
            "host": self.opts.host,
            "port": self.server.port,
            "metrics_port": self.metrics.port,
            "nixl_port": self.backend.nixl_port,
            "agent": self.backend.agent_name,
            "rank": self.opts.rank,
            "tp": self.opts.tp,
        }

    def pong(self) -> Msg:
        return {
            "role": "decode",
            "rank": self.opts.rank,
            "tp": self.opts.tp,
            "agent": self.backend.agent_name,
        }

    def stats(self) -> Msg:
        return {
            "role": "decode",
            "rank": self.opts.rank,
            "reads": len(self.reads),
            "blocks_free": self.backend.num_free,
            **self.counts,
            **self.backend.auth_stats(),
        }

    def _to_leader(self, msg: Msg) -> None:
        if self.leader is not None:
            self.server.reply(self.leader, msg)

    def _request(self, envelope: list[bytes], msg: Msg) -> None:
        op = msg["op"]
        self.leader = envelope
        try:
            if op == "connect":
                for r in msg.get("ranks", []):
                    rank = parse(r, RankParams)
                    self.backend.connect(
                        rank.agent,
                        rank.host,
                        rank.nixl_port,
                        keyed=rank.key_id is not None,
                        layout=rank.layout,
                    )
                    if rank.verdicts and self.opts.policy == "lease" and self.opts.verify_reads:
                        self.verified_agents.add(rank.agent)
            elif op == "read":
                self.waiting.append((envelope, msg))
            elif op == "abort":
                self._abort(str(msg.get("req_id")))
            elif not self.common_op(envelope, msg):
                raise ValueError(f"unknown op {op!r}")
        except (ValueError, TypeError) as exc:
            self.counts["malformed"] += 1
            self.metrics.malformed.inc()
            self.drops.drop(f"malformed {op!r} message", str(exc))
            if op == "read":
                self.server.reply(
                    envelope, {"op": "read_failed", "req_id": msg.get("req_id"), "error": str(exc)}
                )

    def _abort(self, req_id: str) -> None:
        self.waiting = [(e, m) for e, m in self.waiting if str(m.get("req_id")) != req_id]
        rd = self.reads.pop(req_id, None)
        if rd is not None:
            for x in rd.transfers:
                self.backend.release(x)
            self.backend.free(rd.blocks)

    def _start(self) -> None:
        while self.waiting:
            envelope, msg = self.waiting[0]
            req_id = str(msg.get("req_id"))
            try:
                ranks = [parse(r, RankParams) for r in msg.get("ranks", [])]
                num_tokens = int(msg["num_tokens"])
                remote = str(msg["remote_req_id"])
                asked = {str(a) for a in msg.get("verify", [])}
                # vLLM's n: how many D ranks notify each P rank
                notif = wire.encode_transfer_done(
                    remote, max(1, self.opts.tp // max(1, len(ranks)))
                )
            except (ValueError, KeyError, TypeError) as exc:
                self.waiting.pop(0)
                self.server.reply(
                    envelope,
                    {"op": "read_failed", "req_id": req_id, "error": f"bad read request: {exc}"},
                )
                continue
            if self.opts.policy == "lease" and self.opts.verify_reads:
                self.verified_agents.update(r.agent for r in ranks if r.agent in asked)
            verified = [
                r.agent for r in ranks if r.agent in self.verified_agents or r.agent in self.acked
            ]
            if any(a not in self.acked for a in verified):
                return  # the capability handshake with P is still running
            blocks = self.backend.alloc_for(num_tokens)
            if blocks is None:
                return
            self.waiting.pop(0)
            rd = _Read(envelope, req_id, num_tokens, blocks, time.monotonic(), remote)
            try:
                plan = self.backend.read_plan(ranks, blocks, num_tokens)
            except ValueError as exc:  # LayoutError included
                self.backend.free(blocks)
                self.server.reply(
                    envelope,
                    {
                        "op": "read_failed",
                        "req_id": req_id,
                        "error": f"unusable transfer parameters: {exc}",
                    },
                )
                continue
            for rank, local, remote_descs in plan:
                rd.transfers.append(
                    self.backend.read(rank.agent, local, remote_descs, notif_msg=notif)
                )
                if rank.agent in verified:
                    rd.verdicts_due.add(rank.agent)
            rd.ok_from = set(rd.verdicts_due)
            self.reads[req_id] = rd

    def _progress(self) -> None:
        now = time.monotonic()
        for rd in list(self.reads.values()):
            states = [self.backend.transfer_state(x) for x in rd.transfers]
            failed = [x for x in rd.transfers if x.state == "ERR"]
            error = rd.error
            if error is not None:
                pass
            elif failed:
                error = f"READ from {failed[0].peer} failed: {failed[0].error}"
            elif now - rd.started > _READ_TIMEOUT_S and not all(s == "DONE" for s in states):
                error = f"READ still in progress after {_READ_TIMEOUT_S:g} s"
            if error is None and not all(s == "DONE" for s in states):
                continue
            if error is None and rd.verdicts_due:  # read, but not yet confirmed by P
                if not rd.verify_by:
                    rd.verify_by = now + verdict_wait(self.opts.config)
                    continue
                if now < rd.verify_by:
                    continue
                error = f"no verdict from {', '.join(sorted(rd.verdicts_due))} after the READ"
            del self.reads[rd.req_id]
            for x in rd.transfers:
                self.backend.release(x)
            if error is None:
                self.backend.trace.emit(
                    "use", req=rd.req_id, remote=rd.remote, ok_from=sorted(rd.ok_from)
                )
                kv = self.backend.export_shard(rd.blocks, rd.num_tokens)
                self.counts["reads_done"] += 1
                self.metrics.transfers.labels(outcome="done").inc()
                self.server.reply(rd.envelope, {"op": "read_done", "req_id": rd.req_id, "kv": kv})
            else:
                self.counts["reads_failed"] += 1
                self.metrics.transfers.labels(outcome="failed").inc()
                self.server.reply(
                    rd.envelope, {"op": "read_failed", "req_id": rd.req_id, "error": error}
                )
            self.backend.free(rd.blocks)

    def step(self, wait_s: float = IDLE_WAIT_S) -> None:
        if wait_s > 0:  # with reads outstanding, until their verdicts (or the READs) move
            pending = bool(self.reads)
            wait = min(wait_s, PENDING_WAIT_S) if pending else wait_s
            wait_for_input(self.server.sock, wait, self.backend.endpoint if pending else None)
        while (got := self.server.recv()) is not None:
            self._request(*got)
        for sender, payload in self.gate.admit(self.backend.poll()):
            try:
                msg = wire.decode(payload)
            except wire.MalformedMessage as exc:
                self.counts["malformed"] += 1
                self.metrics.malformed.inc()
                self.drops.drop("malformed notification", f"from {sender}: {exc}")
                continue
            self._notification(sender, msg)
        for agent, reason in self.backend.take_lost_peers():
            self._to_leader({"op": "peer_lost", "agent": agent, "reason": reason})
        self.drops.flush()
        self._hellos()
        self._start()
        self._progress()

    def _hellos(self) -> None:
        now = time.monotonic()
        for agent in self.verified_agents - self.acked:
            if not self.backend.is_connected(agent):
                continue
            if now - self.hello_sent.get(agent, -1e18) >= self.opts.config.heartbeat_interval:
                self.hello_sent[agent] = now
                self.backend.send(agent, hello())

    def _notification(self, sender: str, msg: wire.Message) -> None:
        """Verdicts decide this rank's reads; LL and NACKs of an engine that
        gives no verdicts go to rank 0, which owns the scheduler."""
        if isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
            if sender in self.hello_sent:  # an answer to our hello
                self.acked.add(sender)
            return
        rd = next((r for r in self.reads.values() if r.remote == _msg_id(msg)), None)
        act = verdicts.IGNORE
        if isinstance(msg, (wire.Ok, wire.Nack)) and rd is not None:
            act = verdicts.take_verdict(rd.verdicts_due, sender, ok=isinstance(msg, wire.Ok))
        if rd is not None and act != verdicts.IGNORE:
            if act == verdicts.DISCARD and isinstance(msg, wire.Nack):
                self.counts["nacks"] += 1
                self.metrics.nacks.inc()
                rd.error = f"NK ({msg.reason}) from {sender}: the lease had ended"
        elif isinstance(msg, wire.Nack):
            self.counts["nacks"] += 1
            self.metrics.nacks.inc()
            self._to_leader(
                {"op": "nack", "remote_req_id": msg.req_id, "reason": msg.reason, "agent": sender}
            )
        elif isinstance(msg, wire.LeaseLost):
            self._to_leader(
                {
                    "op": "lease_lost",
                    "remote_req_id": msg.req_id,
                    "reason": msg.reason,
                    "agent": sender,
                }
            )

    def describe(self) -> str:
        o = self.opts
        return (
            f"decode rank {o.rank}/{o.tp} serving on {o.host}:{self.server.port} (NIXL "
            f"{self.backend.nixl_port}, agent {self.backend.agent_name})"
        )

    def close(self) -> None:
        self.server.close()
        self.backend.close()
        self.ctx.term()
