"""How the real-engine benchmarks pick ports and notice a taken one
(``benchmarks/_vllm_server.py``); no vLLM needed. The real engine that hangs on a taken
side port, and comes up once started again, is in tests/test_vllm_pd.py."""

from __future__ import annotations

import random
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _vllm_server  # noqa: E402
from _vllm_server import PORT_TAKEN, LogWatch, unclaimed_port  # noqa: E402


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    top = _vllm_server._ephemeral_start()
    ports = [unclaimed_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(max(1024, top - _vllm_server.SPAN) <= p < top for p in ports)


def test_a_bound_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("", 0))  # a port some other process holds
        taken = held.getsockname()[1]
        monkeypatch.setattr(_vllm_server, "_handed", set())
        calls: list[int] = []

        class FirstTheTakenOne(random.Random):
            def randrange(self, *args: int) -> int:  # type: ignore[override]
                calls.append(0)
                return taken if len(calls) == 1 else super().randrange(*args)

        port = unclaimed_port(FirstTheTakenOne())
    assert port != taken and len(calls) >= 2


def test_the_watch_finds_the_words_across_reads_and_keeps_them(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO loading the model\n")
    watch = LogWatch(log, PORT_TAKEN)
    assert not watch.seen()
    cut = len(PORT_TAKEN) // 2
    with log.open("a") as f:
        f.write("zmq.error.ZMQError: " + PORT_TAKEN[:cut])
    assert not watch.seen()
    with log.open("a") as f:
        f.write(PORT_TAKEN[cut:] + " (addr='tcp://localhost:4')\n")
    assert watch.seen()  # the line was cut between two reads
    with log.open("a") as f:
        f.write("INFO more\n" * 100)
    assert watch.seen()


def test_a_clean_log_is_never_taken_for_a_taken_port(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    watch = LogWatch(log, PORT_TAKEN)
    with log.open("a") as f:
        for i in range(200):
            f.write(f"INFO step {i}: Address already\n")
            f.flush()
            assert not watch.seen()
