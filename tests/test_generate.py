"""``leaseproto generate`` against a real router (``Router``, its own loop in a
thread) whose prefill and decode workers are stand-ins on real sockets: P
answers ``prefilled``, D ``decoded`` with tokens computed from the prompt, so
each printed answer can be checked against the request it belongs to. The
whole path through real workers is tests/test_e2e_generate.py."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from leaseproto.cli import main  # noqa: E402
from leaseproto.cli.generate_cmd import read_requests  # noqa: E402
from leaseproto.workers.plane import decode, encode  # noqa: E402
from leaseproto.workers.router import Router, RouterOptions  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def decoded(prompt: list[int], max_tokens: int) -> list[int]:
    """What the stand-in D 'decodes': a function of the request alone."""
    return [(sum(prompt) + i) % 256 for i in range(max_tokens)]


class _Backend:
    """A stand-in P rank and D engine: ROUTER sockets that answer the router."""

    def __init__(self, ctx: Any, *, fail_prompt: int | None = None) -> None:
        self.p_port, self.d_port = _free_port(), _free_port()
        self.p = ctx.socket(zmq.ROUTER)
        self.p.bind(f"tcp://127.0.0.1:{self.p_port}")
        self.d = ctx.socket(zmq.ROUTER)
        self.d.bind(f"tcp://127.0.0.1:{self.d_port}")
        self.fail_prompt = fail_prompt

    def answer(self) -> None:
        for sock, role in ((self.p, "prefill"), (self.d, "decode")):
            while sock.poll(0):
                *env, data = sock.recv_multipart()
                msg = decode(data)
                out: dict[str, Any]
                if msg["op"] == "ping":
                    out = {"op": "pong", "role": role, "engine_id": "e", "tp": 1}
                elif msg["op"] == "prefill":
                    out = {"op": "prefilled", "req_id": msg["req_id"], "engine_id": "e"}
                elif msg["op"] == "decode":
                    prompt, n = msg["prompt"], msg["max_tokens"]
                    if prompt[0] == self.fail_prompt:
                        out = {"op": "decoded", "req_id": msg["req_id"], "ok": False}
                        out["error"] = "P's KV was lost and --on-lost-kv fail"
                    else:
                        out = {"op": "decoded", "req_id": msg["req_id"], "ok": True}
                        out |= {"tokens": decoded(prompt, n), "recomputed": n == 3}
                else:
                    continue
                sock.send_multipart([*env, encode(out)])

    def close(self) -> None:
        self.p.close(0)
        self.d.close(0)


@contextlib.contextmanager
def _running(
    p: str, d: str, backend: _Backend | None = None, key: Path | None = None
) -> Iterator[str]:
    """A real router for P at ``p`` and D at ``d`` (with the cluster key in ``key``),
    its loop (and the stand-ins') in a thread; yields its address."""
    from leaseproto.workers.keys import load_cluster_key

    opts = RouterOptions(prefill=[p], decode=d, metrics_port=None)
    opts.cluster_key = load_cluster_key(key)
    r = Router(opts)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            r.step(timeout_ms=5)
            if backend is not None:
                backend.answer()

    t = threading.Thread(target=loop)
    t.start()
    try:
        yield f"tcp://127.0.0.1:{r.server.port}"
    finally:
        stop.set()
        t.join()
        r.close()
        r.ctx.term()


@pytest.fixture
def router() -> Iterator[str]:
    ctx = zmq.Context()
    backend = _Backend(ctx, fail_prompt=99)
    try:
        p, d = (f"tcp://127.0.0.1:{port}" for port in (backend.p_port, backend.d_port))
        with _running(p, d, backend) as address:
            yield address
    finally:
        backend.close()
        ctx.term()


def test_prompts_and_a_file_as_json_lines(
    router: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(
        '{"id": "a", "prompt": [5, 6, 7], "max_tokens": 3}\n'
        "\n"  # blank lines are skipped
        '{"prompt": [9]}\n'
    )
    argv = ["generate", "--router", router, "--prompt", "1,2,3", "--prompt", "4 5"]
    status = main([*argv, "--file", str(reqs), "--max-tokens", "4", "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    got = {a["id"]: a for a in map(json.loads, out.splitlines())}
    assert set(got) == {"p0", "p1", "a", "f3"}
    for rid, prompt, n in (("p0", [1, 2, 3], 4), ("p1", [4, 5], 4), ("a", [5, 6, 7], 3)):
        assert got[rid]["ok"] and got[rid]["tokens"] == decoded(prompt, n), got[rid]
    assert got["f3"]["tokens"] == decoded([9], 4)
    assert got["a"]["recomputed"] and not got["p0"]["recomputed"]
    assert all(a["error"] is None and a["seconds"] >= 0 for a in got.values())
    assert got["a"]["req_id"].startswith("a-")  # the router's name for it: P's lease id


def test_text_output_and_a_failed_request(router: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--router", router, "--prompt", "1,2", "--prompt", "99,1"]
    assert main([*argv, "--max-tokens", "3"]) == 1  # one failed
    lines = sorted(capsys.readouterr().out.splitlines())
    assert len(lines) == 2, lines
    toks = " ".join(map(str, decoded([1, 2], 3)))
    assert lines[0].startswith(f"p0: {toks} (KV recomputed on D) ("), lines
    assert lines[1].startswith("p1: failed: P's KV was lost and --on-lost-kv fail"), lines


def test_a_router_without_workers_answers_each_request_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _running(f"tcp://127.0.0.1:{_free_port()}", "tcp://127.0.0.1:9") as address:
        assert (
            main(["generate", "--router", address, "--prompt", "1", "--connect-timeout", "3"]) == 1
        )
    out = capsys.readouterr().out
    assert out.startswith("p0: failed: not reachable: prefill rank 0, decode engine"), out


def test_nobody_listening(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--router", f"tcp://127.0.0.1:{_free_port()}", "--prompt", "1"]
    assert main([*argv, "--connect-timeout", "0.3"]) == 1
    err = capsys.readouterr().err
    assert "no answer from tcp://127.0.0.1:" in err and "leaseproto serve router" in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{oops", "x.jsonl:1: not JSON"),
        ("[1, 2]", "x.jsonl:1: expected a JSON object"),
        ('{"prompt": []}', "x.jsonl:1: 'prompt' must be a non-empty list"),
        ('{"prompt": [1, true]}', "'prompt' must be a non-empty list of token ids"),
        ('\n{"prompt": [1], "max_tokens": 0}', "x.jsonl:2: 'max_tokens' must be"),
        ('{"id": "a", "prompt": [1]}\n{"id": "a", "prompt": [2]}', "'a' is used twice"),
    ],
)
def test_a_bad_file_is_refused_before_sending(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    # nobody listens on port 9: a refused file never gets as far as connecting
    assert main(["generate", "--router", "tcp://127.0.0.1:9", "--file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("leaseproto generate: ") and needle in err, err


def test_a_request_the_router_stops_taking_is_one_line_on_stderr(
    router: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ping got through, then the socket takes no request within its send timeout
    (``RouterClient.submit`` raises ``TimeoutError``): one line, status 1, no traceback."""
    from leaseproto.harness import client

    def refused(self: Any, *args: Any, **kwargs: Any) -> None:
        raise TimeoutError("request 'p0' could not be sent to the router (stand-in)")

    monkeypatch.setattr(client.RouterClient, "submit", refused)
    assert main(["generate", "--router", router, "--prompt", "1,2"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "leaseproto generate: request 'p0' could not be sent to the router (stand-in)\n"


def test_nothing_to_send(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--router", "tcp://127.0.0.1:9"]) == 2
    assert "give --prompt IDS or --file FILE" in capsys.readouterr().err


def test_read_requests_default_ids_are_line_numbers() -> None:
    reqs = read_requests(
        ['{"prompt": [1]}', "", '{"prompt": [2], "id": 7}'], max_tokens=5, source="s"
    )
    assert [(r.id, r.prompt, r.max_tokens) for r in reqs] == [("f1", [1], 5), ("7", [2], 5)]


def test_a_keyed_router_answers_only_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import secrets

    key = tmp_path / "cluster.key"
    key.write_text(secrets.token_hex(32) + "\n")
    os.chmod(key, 0o600)
    with _running(f"tcp://127.0.0.1:{_free_port()}", "tcp://127.0.0.1:9", key=key) as address:
        argv = ["generate", "--router", address, "--prompt", "1", "--connect-timeout", "3"]
        assert main([*argv, "--cluster-key-file", str(key), "--connect-timeout", "6"]) == 1
        out, err = capsys.readouterr()
        # it got through: the router answered (it has no workers to send the request to)
        assert out.startswith("p0: failed: not reachable: prefill rank 0"), (out, err)
        assert main(argv) == 1  # without the key: no handshake, no answer
        out, err = capsys.readouterr()
        assert out == "" and "no answer from" in err and "--cluster-key-file" in err
    short = tmp_path / "short.key"
    short.write_text("x")
    assert main([*argv, "--cluster-key-file", str(short)]) == 2
    assert "cluster key file" in capsys.readouterr().err


def test_a_conversation_sends_its_turns_in_order_with_the_conversation_so_far(
    router: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--conversation``: each prompt is a turn's new tokens; turn 2 is sent
    after turn 1's answer, as turn 1's prompt + its answer + the new tokens
    (the stand-in D decodes a function of the whole prompt)."""
    reqs = tmp_path / "turns.jsonl"
    reqs.write_text('{"id": "x0", "prompt": [7], "conversation": "x"}\n')
    argv = ["generate", "--router", router, "--conversation", "c", "--prompt", "1,2"]
    status = main([*argv, "--prompt", "3", "--file", str(reqs), "--max-tokens", "4", "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err
    got = {a["id"]: a for a in map(json.loads, out.splitlines())}
    assert got["p0"]["tokens"] == decoded([1, 2], 4)
    assert got["p1"]["tokens"] == decoded([1, 2, *got["p0"]["tokens"], 3], 4)
    assert got["x0"]["tokens"] == decoded([7], 4)
    assert got["p1"]["conversation"] == "c" and got["x0"]["conversation"] == "x"


def test_read_requests_conversation_field_is_checked() -> None:
    ok = read_requests(['{"prompt": [1], "conversation": "c"}'], max_tokens=2, source="s")
    assert ok[0].conversation == "c"
    with pytest.raises(ValueError, match="conversation"):
        read_requests(['{"prompt": [1], "conversation": 5}'], max_tokens=2, source="s")
