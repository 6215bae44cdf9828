"""The router started before its workers (as by hand): it pings them until
they answer, and logs each one ready once, not once per queued ping."""

from __future__ import annotations

import logging
import time

import pytest

zmq = pytest.importorskip("zmq")

from leaseproto.workers.plane import decode, encode  # noqa: E402
from leaseproto.workers.router import Router, RouterOptions  # noqa: E402


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_router_logs_each_worker_ready_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="leaseproto.router")
    p_port, d_port = _free_port(), _free_port()
    router = Router(
        RouterOptions(
            prefill=[f"tcp://127.0.0.1:{p_port}"],
            decode=f"tcp://127.0.0.1:{d_port}",
            metrics_port=None,
        )
    )
    ctx = zmq.Context()
    workers = []
    try:
        end = time.monotonic() + 1.5  # nobody listens yet: pings queue up
        while time.monotonic() < end:
            router.step(timeout_ms=20)
        for port, pong in (
            (p_port, {"op": "pong", "role": "prefill", "engine_id": "e", "tp": 1}),
            (d_port, {"op": "pong", "role": "decode", "tp": 1}),
        ):
            sock = ctx.socket(zmq.ROUTER)
            sock.bind(f"tcp://127.0.0.1:{port}")
            workers.append((sock, pong))
        end = time.monotonic() + 2.0
        answered = 0
        while time.monotonic() < end:
            router.step(timeout_ms=20)
            for sock, pong in workers:
                while sock.poll(0):
                    frames = sock.recv_multipart()
                    if decode(frames[-1])["op"] == "ping":
                        sock.send_multipart([*frames[:-1], encode(pong)])
                        answered += 1
        assert router.ready
        assert answered > 2  # the queued pings were all answered
        ready = [r.getMessage() for r in caplog.records if " ready" in r.getMessage()]
        assert len(ready) == 2, ready
    finally:
        router.close()
        for sock, _ in workers:
            sock.close(0)
        ctx.term()
        router.ctx.term()
