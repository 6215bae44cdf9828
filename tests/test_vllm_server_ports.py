"""How the real-engine benchmarks pick ports and notice a taken one
(``benchmarks/_vllm_server.py``; the picker itself is tested in tests/test_ports.py); no
vLLM needed. The real engine that hangs on a taken side port, and comes up once started
again, is in tests/test_vllm_pd.py."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from leaseproto.adapters.ports import PORT_SPAN, ephemeral_start

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _vllm_server import PORT_TAKEN, LogWatch, unclaimed_port  # noqa: E402


def test_the_servers_ports_come_from_the_package_picker_and_bind_on_every_address() -> None:
    ports = [unclaimed_port() for _ in range(20)]
    assert len(set(ports)) == 20
    top = ephemeral_start()
    assert all(max(1024, top - PORT_SPAN) <= p < top for p in ports)
    for port in ports[:3]:  # free on every address, as the API server binds it
        with socket.socket() as sock:
            sock.bind(("", port))


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
