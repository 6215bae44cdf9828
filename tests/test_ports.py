"""``leaseproto.adapters.ports.free_port``: ports from below the kernel's ephemeral range,
never twice from one process, never one that is in use."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from leaseproto.adapters import nixl, ports
from leaseproto.adapters.ports import PORT_SPAN, ephemeral_start, free_port


def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    top = ephemeral_start()
    got = [free_port() for _ in range(50)]
    assert len(set(got)) == 50
    assert all(max(1024, top - PORT_SPAN) <= p < top for p in got)


def test_the_nixl_adapter_hands_out_the_same_picker() -> None:
    assert nixl.free_port is free_port


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_handed", set())
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # a port some other process holds
        held.listen()
        taken = held.getsockname()[1]
        calls: list[int] = []

        class FirstTheTakenOne(random.Random):
            def randrange(self, *args: int) -> int:  # type: ignore[override]
                calls.append(0)
                return taken if len(calls) == 1 else super().randrange(*args)

        port = free_port(rng=FirstTheTakenOne())
    assert port != taken and len(calls) >= 2


def test_a_port_handed_out_before_is_passed_over() -> None:
    first = free_port()
    calls: list[int] = []

    class FirstTheOldOne(random.Random):
        def randrange(self, *args: int) -> int:  # type: ignore[override]
            calls.append(0)
            return first if len(calls) == 1 else super().randrange(*args)

    assert free_port(rng=FirstTheOldOne()) != first and len(calls) >= 2


def test_no_free_port_in_the_span_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_bound_port", lambda host, port: None)
    with pytest.raises(OSError, match="no free port in"):
        free_port()


def test_a_range_starting_low_falls_back_to_the_kernels_pick(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    low = tmp_path / "ip_local_port_range"
    low.write_text("1500\t60999\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", low)
    assert ephemeral_start() == 1500
    port = free_port()
    assert not 1024 <= port < 1500  # the kernel's pick, not one from the 476 ports below
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_an_unreadable_range_is_linuxs_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(ports, "_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_start() == 32768


def test_an_address_not_of_this_machine_raises_at_once() -> None:
    with pytest.raises(OSError) as info:
        free_port("192.0.2.1")  # TEST-NET-1: never a local address
    assert "no free port" not in str(info.value)
