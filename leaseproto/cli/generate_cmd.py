"""``leaseproto generate``: send requests to a running router and print the answers.

The client side of ``leaseproto serve router`` without writing Python: each
request is a prompt of token ids (``--prompt 1,2,3``, repeatable) or a line of
a JSON-lines file (``--file``: ``{"prompt": [1, 2, 3], "max_tokens": 8, "id":
"a"}``, ``id`` and ``max_tokens`` optional). Every request is sent at once
(:class:`~leaseproto.harness.client.RouterClient`); each answer is printed as
it arrives, as text or, with ``--json``, as one JSON object a line.

Conversations (``--conversation ID`` for every ``--prompt``, or a line's
``"conversation"`` field): a conversation's requests are its turns, sent one
after another; each turn's prompt names only the *new* tokens, and generate
sends the conversation so far (earlier prompts and answers) plus them, so D's
cached turn is read as the prefix (the answer says whether it was verified or
recomputed).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import fail
from ._flag_types import address, positive_float, positive_int

__all__ = ["Request", "read_requests", "register"]


@dataclass(frozen=True)
class Request:
    """One request to send: its id (the router names P's lease after it), the
    prompt's token ids and how many tokens to decode."""

    id: str
    prompt: list[int]
    max_tokens: int
    #: a turn of this conversation: ``prompt`` is its new tokens
    conversation: str | None = None


def _token_ids(text: str) -> list[int]:
    """``1,2,3`` or ``"1 2 3"``: a prompt of token ids (an argparse type)."""
    parts = text.replace(",", " ").split()
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(
            f"expected token ids >= 0 separated by commas or spaces, e.g. 1,2,3, got {text!r}"
        )
    return ids


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "generate",
        help="send prompts (token ids) to a running router and print what was decoded",
        description="Send requests to a router (leaseproto serve router), all at once, "
        "and print each answer as it arrives: the request's id, the decoded token ids, "
        "whether D recomputed the KV, the time to the answer, or the error. Exit status "
        "0 when every request succeeded, 1 when one failed or got no answer in time, 2 "
        "for a usage error (a bad flag, an unreadable or malformed --file).",
    )
    p.add_argument(
        "--router",
        type=address,
        required=True,
        metavar="ADDRESS",
        help="the router's request-plane address, tcp://HOST:PORT (serve router --port)",
    )
    p.add_argument(
        "--prompt",
        type=_token_ids,
        action="append",
        default=[],
        metavar="IDS",
        help="a prompt of token ids, e.g. 1,2,3 (repeat for more requests)",
    )
    p.add_argument(
        "--file",
        metavar="FILE",
        default=None,
        help='JSON lines, one request each: {"prompt": [1, 2, 3]} and optionally "max_tokens" '
        'and "id" (default f<line number>); - reads standard input',
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=8,
        metavar="N",
        help="tokens to decode per request (a --file line's max_tokens wins)",
    )
    p.add_argument(
        "--conversation",
        default=None,
        metavar="ID",
        help="the --prompt requests are the turns of conversation ID, in order: each "
        "prompt is a turn's new tokens (a --file line's conversation field does the same)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object per answer")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="give up on answers not in this long after sending",
    )
    p.add_argument(
        "--cluster-key-file",
        default=None,
        metavar="PATH",
        help="the cluster key file the router was started with (serve --cluster-key-file): "
        "a keyed router answers no client without it",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the router to answer and to see its workers",
    )
    p.set_defaults(func=run)


def read_requests(lines: list[str], *, max_tokens: int, source: str) -> list[Request]:
    """The requests of a JSON-lines text (blank lines skipped).

    Raises:
        ValueError: a line that is not a request, naming ``source:line``.
    """
    out: list[Request] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object with a 'prompt'")
        prompt, tokens = obj.get("prompt"), obj.get("max_tokens", max_tokens)
        if not (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
        ):
            raise ValueError(f"{where}: 'prompt' must be a non-empty list of token ids >= 0")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ValueError(f"{where}: 'max_tokens' must be a whole number >= 1")
        rid = obj.get("id", f"f{n}")
        conv = obj.get("conversation")
        if conv is not None and (not isinstance(conv, str) or not conv):
            raise ValueError(f"{where}: 'conversation' must be a non-empty string")
        out.append(Request(str(rid), prompt, tokens, conv))
    return out


def _requests(args: argparse.Namespace) -> list[Request]:
    """Every request the flags name: the --prompt ones, then the --file lines.

    Raises:
        ValueError: none at all, an unreadable or malformed file, an id twice.
    """
    conv = args.conversation
    reqs = [Request(f"p{i}", ids, args.max_tokens, conv) for i, ids in enumerate(args.prompt)]
    if args.file is not None:
        try:
            text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {args.file}: {exc}") from exc
        source = "stdin" if args.file == "-" else args.file
        reqs += read_requests(text.splitlines(), max_tokens=args.max_tokens, source=source)
    if not reqs:
        raise ValueError("nothing to send: give --prompt IDS or --file FILE")
    seen: set[str] = set()
    for r in reqs:
        if r.id in seen:
            raise ValueError(f"request id {r.id!r} is used twice (each answer is matched by id)")
        seen.add(r.id)
    return reqs


def _connect(router: str, timeout: float, curve: Any) -> str | None:
    """Wait for the router to answer and to have heard from its workers; why
    it did not (None: ready). A router that answers but is not ready by the
    timeout is still sent the requests: its answers name the missing workers."""
    from ..workers.plane import call  # noqa: PLC0415 - pyzmq, on use

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            pong = call(router, {"op": "ping"}, timeout=max(0.1, min(left, 2.0)), curve=curve)
        except TimeoutError:
            if time.monotonic() >= deadline:
                return (
                    f"no answer from {router} within {timeout:g} s: is a router "
                    "(leaseproto serve router) listening there, and if it has a cluster key, "
                    "is it the one of --cluster-key-file?"
                )
            continue
        role = pong.get("role")
        if role != "router":
            return (
                f"{router} is a {role or 'worker that is not a router'}: give the router's address"
            )
        if pong.get("ready") or time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def _show(msg: dict[str, Any], as_json: bool) -> str:
    latency = msg.get("_latency")
    if as_json:
        keys = ("id", "ok", "tokens", "error", "recomputed", "req_id")
        extra = {k: msg[k] for k in ("conversation", "prefix") if k in msg}
        return json.dumps({**{k: msg.get(k) for k in keys}, **extra, "seconds": latency})
    took = "" if latency is None else f" ({latency:.2f} s)"
    if not msg.get("ok"):
        return f"{msg.get('id')}: failed: {msg.get('error')}{took}"
    tokens = " ".join(str(t) for t in msg.get("tokens", []))
    again = " (KV recomputed on D)" if msg.get("recomputed") else ""
    prefix = msg.get("prefix")
    if isinstance(prefix, dict):
        how = "verified" if prefix.get("verified") else f"recomputed {prefix.get('recomputed')}"
        again += f" (prefix of {prefix.get('tokens')} tokens from D: {how})"
    return f"{msg.get('id')}: {tokens}{again}{took}"


def run(args: argparse.Namespace) -> int:
    try:
        reqs = _requests(args)
    except ValueError as exc:
        return fail("generate", str(exc))
    from ..harness.client import RouterClient  # noqa: PLC0415 - pyzmq, on use
    from ..workers.keys import curve, load_cluster_key  # noqa: PLC0415

    try:
        keys = curve(load_cluster_key(args.cluster_key_file))
    except ValueError as exc:
        return fail("generate", str(exc))
    problem = _connect(args.router, args.connect_timeout, keys)
    if problem is not None:
        print(f"leaseproto generate: {problem}", file=sys.stderr)
        return 1
    client = RouterClient(args.router, curve=keys)
    failed = 0
    turns = _Turns(reqs)
    try:
        for r in turns.first():
            client.submit(r.id, r.prompt, r.max_tokens, conversation=r.conversation)
        deadline = time.monotonic() + args.timeout
        while len(client.results) < len(reqs) and time.monotonic() < deadline:
            for msg in client.poll(min(0.2, max(0.0, deadline - time.monotonic()))):
                failed += not msg.get("ok")
                nxt = turns.answered(msg)
                if nxt is not None:
                    msg["conversation"] = nxt[0]
                print(_show(msg, args.json), flush=True)
                if nxt is not None and nxt[1] is not None:
                    r = nxt[1]
                    client.submit(r.id, r.prompt, r.max_tokens, conversation=r.conversation)
    except TimeoutError as exc:  # the router stopped taking requests (RouterClient.submit)
        print(f"leaseproto generate: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    missing = [r.id for r in reqs if r.id not in client.results]
    if missing:
        print(
            f"leaseproto generate: no answer within {args.timeout:g} s for "
            f"{len(missing)} request(s): {', '.join(missing[:10])}",
            file=sys.stderr,
        )
    return 1 if failed or missing else 0


class _Turns:
    """Conversations' turns, sent one after another, each with the
    conversation so far (earlier prompts and answers) before its new tokens."""

    def __init__(self, reqs: list[Request]) -> None:
        self.queues: dict[str, list[Request]] = {}
        self.loose: list[Request] = []
        for r in reqs:
            if r.conversation is None:
                self.loose.append(r)
            else:
                self.queues.setdefault(r.conversation, []).append(r)
        self.so_far: dict[str, list[int]] = {conv: [] for conv in self.queues}
        self.sent: dict[str, tuple[str, list[int]]] = {}  # request id -> (conversation, prompt)

    def first(self) -> list[Request]:
        out = list(self.loose)
        for conv in self.queues:
            nxt = self._next(conv)
            if nxt is not None:
                out.append(nxt)
        return out

    def _next(self, conv: str) -> Request | None:
        queue = self.queues[conv]
        if not queue:
            return None
        r = queue.pop(0)
        prompt = [*self.so_far[conv], *r.prompt]
        self.sent[r.id] = (conv, prompt)
        return Request(r.id, prompt, r.max_tokens, conv)

    def answered(self, msg: dict[str, Any]) -> tuple[str, Request | None] | None:
        """The answer's conversation and its next turn to send (None: not a
        turn). A failed turn ends its conversation: later turns are not sent."""
        turn = self.sent.pop(str(msg.get("id")), None)
        if turn is None:
            return None
        conv, prompt = turn
        if not msg.get("ok"):
            self.queues[conv].clear()
            return conv, None
        self.so_far[conv] = [*prompt, *msg.get("tokens", [])]
        return conv, self._next(conv)
