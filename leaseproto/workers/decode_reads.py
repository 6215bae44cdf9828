"""Decode rank 0's reads of P's KV and what their verdicts decide (verified
reads, I13): :class:`PReads`, a part of
:class:`~leaseproto.workers.decode.DecodeWorker`.

A request's READs start once every P rank of its engine is connected and
greeted (:mod:`.decode_verification`); each READ carries the transfer-done
notification (``<id>:<n>``, ``n`` = the D ranks that read this P rank), which
NIXL delivers after the READ completed, and ranks 1.. read their share of the
heads at the same time (:mod:`.decode_follower`). A P that advertised
``leaseproto/1`` answers every transfer-done with a verdict: ``OK`` (the lease
was live when it handled the notification, so the bytes read are the blocks
it granted) or ``NK`` (it had ended). D emits no token computed from P's KV
until it holds ``OK`` from every P rank it read from (ranks 1.. wait for
their own verdicts before they hand over their shard). ``NK``, or no verdict
within :func:`~.decode_state.verdict_wait` of the READ's completion, discards
what was read: the request is recomputed locally (or fails,
``on_kv_loss="error"``).

What this part keeps lives on each request (:class:`~.decode_state.Req`: its
transfers, the verdicts still due, the followers still reading); it decides
and counts, and the worker acts: a method returns why a request fails over,
or the verdict's act (:mod:`.verdicts`).
"""

from __future__ import annotations

from ..adapters.kv_pool import LayoutError
from ..core import wire
from . import verdicts
from .backend import KVBackend
from .decode_fanout import Followers
from .decode_state import DecodeOptions, Reporting, Req, verdict_wait
from .plane import Msg

__all__ = ["PReads"]


class PReads:
    """The READs of P's KV for decode rank 0, their verdicts and their use."""

    def __init__(
        self, opts: DecodeOptions, backend: KVBackend, followers: Followers, out: Reporting
    ) -> None:
        self.opts = opts
        self.config = opts.config
        self.backend = backend
        self.followers = followers
        self.out = out

    def start(self, req: Req, *, now: float) -> str | None:
        """Post ``req``'s READs (transfer-done attached) and ask the followers
        for theirs; why they could not all start (the worker fails the request
        over and tells P), or None."""
        req.state = "reading"
        req.read_started = now
        # vLLM's n: how many D ranks notify each P rank (the lease's readers)
        notif = wire.encode_transfer_done(
            req.remote_req_id, verdicts.readers_per_p_rank(self.opts.tp, len(req.ranks))
        )
        try:
            plan = self.backend.read_plan(req.ranks, req.blocks, req.num_tokens)
        except (LayoutError, ValueError) as exc:
            self.out.malformed(f"transfer parameters of req {req.req_id}: {exc}")
            return f"unusable transfer parameters: {exc}"
        for rank, local, remote in plan:
            req.transfers.append(self.backend.read(rank.agent, local, remote, notif_msg=notif))
            if req.verified:
                req.verdicts_due.add(rank.agent)
        req.ok_from = sorted(req.verdicts_due)
        req.followers_pending.update(self.followers.ranks)
        refused = self.followers.read(req)
        if refused is not None:
            return f"decode rank {refused} is not taking requests"
        return None

    def progress(self, req: Req, *, now: float) -> str | None:
        """Poll a reading request's READs: why one failed (the worker fails the
        request over and tells P), or None. Once every READ is done and every
        follower's shard is in, the request is ``verifying``: it waits for its
        verdicts until ``verify_by``."""
        states = [self.backend.transfer_state(x) for x in req.transfers]
        failed = [x for x in req.transfers if x.state == "ERR"]
        if failed:
            self.out.metrics.transfers.labels(outcome="failed").inc()
            return f"READ from {failed[0].peer} failed: {failed[0].error}"
        if all(s == "DONE" for s in states) and not req.followers_pending:
            self.drop(req)
            self.out.metrics.transfers.labels(outcome="done").inc()
            self.out.metrics.transfer_time.observe(now - req.read_started)
            req.read_done_at = now
            req.verify_by = now + verdict_wait(self.config)
            req.state = "verifying"
        return None

    def shard(self, req: Req, rank: int, msg: Msg) -> str | None:
        """Follower ``rank``'s answer for ``req`` (``read_done`` with its shard,
        or ``read_failed``): why the request fails over, or None (shard in)."""
        if msg.get("op") == "read_failed":
            self.out.metrics.transfers.labels(outcome="failed").inc()
            return f"decode rank {rank}: {msg.get('error')}"
        try:
            kv = msg.get("kv")
            if not isinstance(kv, bytes):
                raise ValueError("no KV bytes in the answer")
            self.backend.import_shard(rank, self.opts.tp, req.blocks, req.num_tokens, kv)
        except ValueError as exc:
            return f"decode rank {rank} sent a bad shard: {exc}"
        req.followers_pending.discard(rank)
        return None

    def drop(self, req: Req) -> None:
        """Release ``req``'s transfers; followers still reading for it drop
        their reads unfinished and unanswered."""
        for xfer in req.transfers:
            self.backend.release(xfer)
        req.transfers.clear()
        if req.followers_pending:
            self.followers.abort(req.req_id)
        req.followers_pending.clear()

    # -- the verdicts ---------------------------------------------------------------------
    def verdict(self, req: Req | None, sender: str, msg: wire.Ok | wire.Nack) -> str:
        """What a verdict from ``sender`` decides for ``req``: :data:`~.verdicts.IGNORE`
        (not owed: unknown, answered, or from an agent already heard),
        :data:`~.verdicts.WAIT`, :data:`~.verdicts.USE` or
        :data:`~.verdicts.DISCARD` (an ``NK``: counted and logged here)."""
        if req is None or req.done:
            return verdicts.IGNORE
        act = verdicts.take_verdict(req.verdicts_due, sender, ok=isinstance(msg, wire.Ok))
        if act == verdicts.DISCARD and isinstance(msg, wire.Nack):
            self.out.counts["verdicts_nk"] += 1
            self.out.counts["nacks"] += 1
            self.out.metrics.nacks.inc()
            self.out.metrics.verdicts.labels(verdict="nk").inc()
            self.out.notes.drop(
                "NK",
                f"({msg.reason}) from {sender} for req {req.req_id}: its lease had ended when "
                "P handled the transfer-done; discarding what was read",
            )
        return act

    def overdue(self, req: Req) -> str:
        """No verdict came by ``verify_by``: counted and logged; why the request
        fails over (what was read is discarded)."""
        wait = verdict_wait(self.config)
        self.out.counts["verdict_timeouts"] += 1
        self.out.metrics.verdicts.labels(verdict="timeout").inc()
        self.out.notes.drop(
            "no verdict",
            f"req {req.req_id}: none from {', '.join(sorted(req.verdicts_due))} within "
            f"{wait:.2f} s of its READ: discarding what was read",
        )
        return f"no verdict within {wait:g} s of the READ"

    def use(self, req: Req, *, now: float) -> None:
        """Decode from what was read: every verdict is OK (or the engine gives
        none)."""
        if req.verified:
            self.out.counts["verified_reads"] += 1
            self.out.metrics.verdicts.labels(verdict="ok").inc()
            waited = max(0.0, now - req.read_done_at)
            self.out.metrics.verdict_wait.observe(waited)
            self.out.counts["verdict_wait_us"] += round(waited * 1e6)
        else:
            self.out.counts["unverified_reads"] += 1
            self.out.metrics.verdicts.labels(verdict="unverified").inc()
        self.backend.trace.emit(
            "use", req=req.req_id, remote=req.remote_req_id, ok_from=req.ok_from
        )
        req.start_token = req.first_token
        req.kv_in = True
        req.state = "decoding"
