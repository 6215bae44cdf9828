"""What decode rank 0 gives back for a request: :class:`Output`, a part of
:class:`~leaseproto.workers.decode.DecodeWorker` that runs the model and
answers the router.

The model computes a request's tokens from P's KV once it is read (and
verified, :mod:`.decode_reads`), or from its prompt computed here
(:meth:`Output.recompute`). When P's KV is lost, ``on_kv_loss`` decides
between that and a clear error (:meth:`Output.failover`). One decode step of
the running set (:meth:`Output.decode`) produces a request's tokens in one
call, and the request then holds its slot for one step per further token, as
a batch member would. :meth:`Output.answer` keeps a conversation's turn under
a lease P can read for the next turn (``turns.keep``, :mod:`.decode_turns`)
or frees the request's blocks, and gives the router the tokens, whether they
were recomputed and, for a turn, where it is cached, or the error;
:meth:`Output.refuse` answers a request that will not be served.

What it decides lives on each request (:class:`~.decode_state.Req`: its
first token, its tokens, the steps left, whether it is recomputed); the
scheduler (:mod:`.decode_scheduler`) holds the requests, takes a request out
of its queues before it is answered, and acts on what a method returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

from .backend import KVBackend
from .decode_state import DecodeOptions, Reporting, Req
from .decode_turns import TurnGrants
from .plane import Server

__all__ = ["Output"]

log = logging.getLogger("leaseproto.decode")


class Output:
    """The model's tokens for decode rank 0's requests, and their answers."""

    def __init__(
        self,
        opts: DecodeOptions,
        backend: KVBackend,
        server: Server,
        out: Reporting,
        turns: TurnGrants,
    ) -> None:
        """``server``: where the answers go."""
        self.opts = opts
        self.backend = backend
        self.server = server
        self.out = out
        self.turns = turns

    def failover(self, req: Req, reason: str) -> str | None:
        """P's KV for ``req`` is unusable (the scheduler dropped what was read):
        the error to answer with (``on_kv_loss="error"``), or None: ``req`` is
        to be recomputed here (``"recompute"``: same model, same tokens; by
        :meth:`recompute` once it holds blocks)."""
        if self.opts.on_kv_loss == "error":
            self.out.metrics.failovers.labels(action="error").inc()
            return f"KV of req {req.req_id} lost: {reason}"
        self.out.metrics.failovers.labels(action="recompute").inc()
        req.recompute = True
        req.needs_remote_kv = False
        log.info("req %s will be recomputed locally: %s", req.req_id, reason)
        return None

    def recompute(self, req: Req) -> None:
        """Compute ``req``'s prompt here, into its blocks: decoding starts from
        our own first token."""
        req.start_token = self.backend.prefill(req.prompt, req.blocks)
        req.tokens.clear()
        req.state = "decoding"
        self.out.counts["recomputed"] += 1

    def decode(self, reqs: Iterable[Req]) -> Iterator[tuple[Req, str | None]]:
        """One decode step of ``reqs`` (the running set): each request that is
        done, as it is done, with why it failed (None: its tokens are in). The
        model produces a request's tokens in one call when its KV is in; the
        request then holds its slot for one step per further token
        (``step_time`` each, the modelled forward pass, slept after the last
        request is handed over), as a batch member would."""
        stepped = False
        for req in list(reqs):
            if req.state != "decoding":
                continue
            if not req.tokens:
                try:
                    req.tokens = self.backend.decode(
                        req.blocks,
                        req.num_tokens,
                        req.start_token,
                        req.max_tokens,
                        keep=req.cache_turn,
                    )
                except (ValueError, IndexError, RuntimeError) as exc:  # never stop the loop
                    self.out.notes.drop(
                        "decode failed", f"req {req.req_id}: {exc}", level=logging.ERROR
                    )
                    yield req, f"decode failed: {exc}"
                    continue
                req.steps_left = req.max_tokens - 1
            if req.steps_left > 0:
                req.steps_left -= 1
                stepped = True
            if req.steps_left <= 0:
                yield req, None
        if stepped and self.opts.step_time > 0:
            time.sleep(self.opts.step_time)  # the modelled forward pass

    def answer(self, req: Req, *, ok: bool, error: str | None = None) -> None:
        """``req`` is done (out of the scheduler's queues): its turn kept or
        its blocks freed, counted, and the router answered."""
        cache = self.turns.keep(req) if ok and req.cache_turn else None
        self.backend.free(req.blocks)
        req.blocks = []
        req.done = True
        if ok:
            self.out.counts["completed"] += 1
            self.out.metrics.completed.inc()
        else:
            self.out.counts["failed"] += 1
        self.server.reply(
            req.envelope,
            {
                "op": "decoded",
                "req_id": req.req_id,
                "ok": ok,
                "tokens": req.tokens if ok else [],
                "error": error,
                "recomputed": req.recompute,
                **({"cache": cache} if cache is not None else {}),
            },
        )

    def refuse(self, envelope: list[bytes], req_id: object, error: str) -> None:
        """Answer a ``decode`` request that will not be served."""
        self.server.reply(
            envelope, {"op": "decoded", "req_id": req_id, "ok": False, "tokens": [], "error": error}
        )
