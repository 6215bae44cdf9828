"""The router: one process, one single-threaded loop.

A client sends ``{"op": "generate", "id": ..., "prompt": [token ids],
"max_tokens": n}``. The router names the request for P (``<id>-<16 hex>``: 64
random bits, so no peer can guess a lease id it was never told), sends
``prefill`` to every rank of the prefill engine, collects each rank's transfer
parameters (its NIXL agent and address, block ids, the block layout and the
lease time left, a duration), and sends ``decode`` to the decode engine with
all of them. D's answer goes back to the client as
``{"op": "result", "id", "req_id", "ok", "tokens", "error", "recomputed"}``.

Failures are answers, never hangs: a worker whose connection drops fails every
request waiting on it (ZeroMQ socket monitor), a rank that cannot prefill
fails the request and the other ranks are told to abort (so they free at once
instead of at expiry), and every request has a deadline; a request given up
on is aborted on D and P, so nothing stays held (whom it tells, for each cause,
is :func:`.giveup.give_up`, which the model checker runs too: I17). A request no worker could
ever schedule (more positions than the model has, more blocks than a pool
holds: the limits each worker reports in its ``pong``) is refused at intake.

The router does not reply to ``generate`` until it has heard from every
worker (``ping``); its own ``ping`` answer says whether it is ``ready``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..core import wire
from ..core.mac import ClusterKey
from .conversations import Conversations, prefix_summary
from .giveup import give_up
from .keys import announce, curve
from .limits import never_fits
from .loop import EngineLoop
from .messages import Generate, parse
from .metrics import RouterMetrics
from .notifications import DropLog
from .plane import BadMessage, Msg, Peer, Server

__all__ = ["Router", "RouterOptions"]

log = logging.getLogger("leaseproto.router")


@dataclass
class RouterOptions:
    host: str = "127.0.0.1"
    port: int = 0
    prefill: Sequence[str] = ()  # one request-plane address per P rank, in rank order
    decode: str = ""  # the decode engine's leader
    metrics_port: int | None = 0
    #: seconds a request may take end to end before it fails
    request_timeout: float = 120.0
    #: run every request-plane socket over CURVE (``--cluster-key-file``)
    cluster_key: ClusterKey | None = None


@dataclass
class _Pending:
    envelope: list[bytes]
    client_id: Any
    req_id: str
    prompt: list[int]
    max_tokens: int
    started: float
    stage: str = "prefill"
    ranks: dict[int, Msg] = field(default_factory=dict)
    prefilled_at: float = 0.0
    conversation: str | None = None


class Router(EngineLoop):
    """Routes each request to the prefill engine, then the decode engine."""

    def __init__(
        self, opts: RouterOptions, *, ctx: zmq.Context[zmq.Socket[bytes]] | None = None
    ) -> None:
        if not opts.prefill or not opts.decode:
            raise ValueError("the router needs at least one prefill address and a decode address")
        self.opts = opts
        self.ctx: zmq.Context[zmq.Socket[bytes]] = ctx if ctx is not None else zmq.Context()
        announce("router", opts.cluster_key)
        keys = curve(opts.cluster_key)
        self.server = Server(self.ctx, opts.host, opts.port, curve=keys)
        self.prefill = [Peer(self.ctx, a, curve=keys) for a in opts.prefill]
        self.decode = Peer(self.ctx, opts.decode, curve=keys)
        self.info: dict[int, Msg] = {}  # peer index -> its ping answer (decode is -1)
        self.pending: dict[str, _Pending] = {}
        self.metrics = RouterMetrics()
        if opts.metrics_port is not None:
            self.metrics.serve(opts.host, opts.metrics_port)
        self._last_ping = -1e9
        self.conversations = Conversations(metrics=self.metrics)
        self.notes = DropLog(log, prefix="")  # lines a client or worker can trigger

    # -- readiness ------------------------------------------------------------------------
    def ready_info(self) -> dict[str, Any]:
        return {
            "role": "router",
            "host": self.opts.host,
            "port": self.server.port,
            "metrics_port": self.metrics.port,
        }

    @property
    def ready(self) -> bool:
        return len(self.info) == len(self.prefill) + 1

    def _ping_peers(self, now: float) -> None:
        if self.ready or now - self._last_ping < 0.2:
            return
        self._last_ping = now
        for i, peer in enumerate(self.prefill):
            if i not in self.info:
                peer.send({"op": "ping"})
        if -1 not in self.info:
            self.decode.send({"op": "ping"})

    # -- client side ----------------------------------------------------------------------
    def _client(self, envelope: list[bytes], msg: Msg, now: float) -> None:
        op = msg["op"]
        if op == "generate":
            self._generate(envelope, msg, now)
        elif not self.common_op(envelope, msg):
            self.metrics.malformed.inc()
            self.server.reply(envelope, {"op": "error", "error": f"unknown op {op!r}"})

    def _generate(self, envelope: list[bytes], msg: Msg, now: float) -> None:
        cid = msg.get("id")
        try:
            gen = parse(msg, Generate)
        except BadMessage as exc:
            self.metrics.malformed.inc()
            self.server.reply(
                envelope, {"op": "result", "id": cid, "ok": False, "tokens": [], "error": str(exc)}
            )
            return
        prompt, max_tokens = gen.prompt, gen.max_tokens
        if not self.ready:
            missing = [
                f"prefill rank {i}" for i in range(len(self.prefill)) if i not in self.info
            ] + (["decode engine"] if -1 not in self.info else [])
            self.server.reply(
                envelope,
                {
                    "op": "result",
                    "id": cid,
                    "ok": False,
                    "tokens": [],
                    "error": "not reachable: " + ", ".join(missing),
                },
            )
            return
        problem = self._never_fits(len(prompt), max_tokens)
        if problem is not None:
            self.metrics.malformed.inc()
            self.server.reply(
                envelope,
                {"op": "result", "id": cid, "ok": False, "tokens": [], "error": problem},
            )
            return
        base = str(cid) if cid is not None else "req"
        # 64 random bits: P's lease ids cannot be guessed by a peer never told them
        req_id = f"{base}-{secrets.token_hex(8)}"
        try:
            wire.check_id(req_id)
        except ValueError as exc:
            self.server.reply(
                envelope,
                {
                    "op": "result",
                    "id": cid,
                    "ok": False,
                    "tokens": [],
                    "error": f"bad request id: {exc}",
                },
            )
            return
        conv = gen.conversation
        p = _Pending(envelope, cid, req_id, prompt, max_tokens, now, conversation=conv)
        self.pending[req_id] = p
        # the decode engine's NIXL agents: P binds the lease to them (spec §10.2)
        agents = self.info.get(-1, {}).get("agents")
        readers: Msg = {"readers": agents} if isinstance(agents, list) and agents else {}
        self.metrics.in_flight.set(len(self.pending))
        if conv is not None:  # a later turn reads the last one's KV from D
            readers.update(self.conversations.prefix(conv, prompt, now=now))
        for i, peer in enumerate(self.prefill):
            # no d_tp: P grants before D is chosen; each reader's transfer-done
            # says how many D ranks read that P rank (its n)
            if not peer.send({"op": "prefill", "req_id": req_id, "prompt": prompt, **readers}):
                self._give_up(p, "unsent")
                self._finish(p, now, ok=False, error=f"prefill rank {i} is not taking requests")
                return

    def _never_fits(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why no worker could ever schedule this request, or None."""
        workers = [(f"prefill rank {i}", self.info[i]) for i in range(len(self.prefill))]
        return never_fits([*workers, ("the decode engine", self.info[-1])], prompt_len, max_tokens)

    def _finish(
        self,
        p: _Pending,
        now: float,
        *,
        ok: bool,
        tokens: Sequence[int] = (),
        error: str | None = None,
        recomputed: bool = False,
        cache: object = None,
    ) -> None:
        self.pending.pop(p.req_id, None)
        if p.conversation is not None:
            self.conversations.remember(p.conversation, p.prompt, tokens, cache, now=now)
        prefixes = [r["prefix"] for r in p.ranks.values() if isinstance(r.get("prefix"), dict)]
        self.server.reply(
            p.envelope,
            {
                "op": "result",
                "id": p.client_id,
                "req_id": p.req_id,
                "ok": ok,
                "tokens": list(tokens),
                "error": error,
                "recomputed": recomputed,
                **({"prefix": prefix_summary(prefixes)} if prefixes else {}),
            },
        )
        self.metrics.requests.labels(outcome="ok" if ok else "error").inc()
        self.metrics.latency.observe(now - p.started)
        self.metrics.in_flight.set(len(self.pending))
        if not ok:
            self.notes.drop("request failed", f"{p.req_id}: {error}")

    # -- worker side ----------------------------------------------------------------------
    def _from_prefill(self, index: int, msg: Msg, now: float) -> None:
        op = msg["op"]
        if op == "pong":
            known = index in self.info
            self.info[index] = msg
            if known:
                return
            log.info(
                "prefill rank %d ready: engine %s, tp %s",
                index,
                msg.get("engine_id"),
                msg.get("tp"),
            )
            return
        p = self.pending.get(str(msg.get("req_id")))
        if p is None or p.stage != "prefill":
            return  # an answer for a request that already failed
        if op != "prefilled":
            self._give_up(p, "rank_failed", rank=index)
            self._finish(
                p, now, ok=False, error=f"prefill rank {index} failed: {msg.get('error', op)}"
            )
            return
        p.ranks[index] = msg
        if len(p.ranks) < len(self.prefill):
            return
        p.prefilled_at = now
        ranks = []
        for i in range(len(self.prefill)):
            r = dict(p.ranks[i])
            r.pop("op", None)
            # the lease time left, as a duration: less what the router held it
            r["lease_remaining"] = float(r.get("lease_remaining", 0.0)) - (now - r["_recv_at"])
            r.pop("_recv_at", None)
            ranks.append(r)
        sent = self.decode.send(
            {
                "op": "decode",
                "req_id": p.req_id,
                "prompt": p.prompt,
                "max_tokens": p.max_tokens,
                "cache_turn": p.conversation is not None,
                "params": {
                    "remote_req_id": p.req_id,
                    "engine_id": ranks[0]["engine_id"],
                    "p_tp": len(ranks),
                    "ranks": ranks,
                },
            }
        )
        if not sent:  # D will never read it: free P's blocks now rather than at expiry
            self._give_up(p, "decode_unreachable")
            self._finish(p, now, ok=False, error="the decode engine is not taking requests")
            return
        p.stage = "decode"

    def _give_up(self, p: _Pending, cause: str, *, rank: int | None = None) -> None:
        """Send the aborts :func:`.giveup.give_up` names for failing ``p``."""
        out = give_up(cause, stage=p.stage, p_ranks=len(self.prefill), rank=rank)
        for i in out.prefill:
            self.prefill[i].send({"op": "abort", "req_id": p.req_id})
        if out.decode:
            self.decode.send({"op": "abort", "req_id": p.req_id})

    def _from_decode(self, msg: Msg, now: float) -> None:
        op = msg["op"]
        if op == "pong":
            agents = msg.get("agents")
            if isinstance(agents, list) and len(agents) < int(msg.get("tp") or 1):
                return  # a rank's agent is not known yet: ask again (_ping_peers)
            known = -1 in self.info
            self.info[-1] = msg
            if not known:
                log.info("decode engine ready: tp %s", msg.get("tp"))
            return
        p = self.pending.get(str(msg.get("req_id")))
        if p is None or p.stage != "decode":
            return
        if not msg.get("ok"):  # D will not read (or no longer needs) P's blocks
            self._give_up(p, "decode_failed")
        if op == "decoded":
            self._finish(
                p,
                now,
                ok=bool(msg.get("ok")),
                tokens=msg.get("tokens") or [],
                error=msg.get("error"),
                recomputed=bool(msg.get("recomputed")),
                cache=msg.get("cache"),
            )
        else:
            self._finish(p, now, ok=False, error=f"decode failed: {msg.get('error', op)}")

    def _lost(self, stage: str, index: int | None, now: float) -> None:
        name = "decode engine" if index is None else f"prefill rank {index}"
        for p in list(self.pending.values()):
            if p.stage == stage:
                self._give_up(p, "lost", rank=index)
                self._finish(p, now, ok=False, error=f"{name} disconnected")
        if index is None:
            self.info.pop(-1, None)
        else:
            self.info.pop(index, None)
        log.warning("%s disconnected: failed its pending requests", name)

    def _timeouts(self, now: float) -> None:
        limit = self.opts.request_timeout
        for p in list(self.pending.values()):
            if now - p.started > limit:
                # give up everywhere, so nothing stays held for an answer no one awaits
                self._give_up(p, "timeout")
                self._finish(
                    p, now, ok=False, error=f"no answer within {limit:g} s (stage {p.stage})"
                )

    # -- loop -----------------------------------------------------------------------------
    def step(self, timeout_ms: int = 50) -> None:
        """One loop turn: wait up to ``timeout_ms`` for traffic, then handle all of it."""
        poller = zmq.Poller()
        poller.register(self.server.sock, zmq.POLLIN)
        for peer in (*self.prefill, self.decode):
            poller.register(peer.sock, zmq.POLLIN)
            poller.register(peer.monitor, zmq.POLLIN)
        poller.poll(timeout_ms)
        now = time.monotonic()
        while (got := self.server.recv()) is not None:
            self._client(got[0], got[1], now)
        for i, peer in enumerate(self.prefill):
            while (msg := peer.recv()) is not None:
                msg["_recv_at"] = now
                self._from_prefill(i, msg, now)
            if peer.disconnected():
                self._lost("prefill", i, now)
        while (msg := self.decode.recv()) is not None:
            self._from_decode(msg, now)
        if self.decode.disconnected():
            self._lost("decode", None, now)
        bad = self.server.bad + sum(p.bad for p in (*self.prefill, self.decode))
        if bad:
            self.metrics.malformed.inc(bad)
            self.server.bad = 0
            for peer in (*self.prefill, self.decode):
                peer.bad = 0
        self._ping_peers(now)
        self._timeouts(now)

    def pong(self) -> Msg:
        return {"role": "router", "ready": self.ready, "metrics_port": self.metrics.port}

    def stats(self) -> Msg:
        return {
            "role": "router",
            "in_flight": len(self.pending),
            "conversations": len(self.conversations),
            **self.conversations.counts,
        }

    def describe(self) -> str:
        return (
            f"router listening on {self.opts.host}:{self.server.port} (prefill "
            f"{list(self.opts.prefill)}, decode {self.opts.decode})"
        )

    def close(self) -> None:
        for peer in (*self.prefill, self.decode):
            peer.close()
        self.server.close()
