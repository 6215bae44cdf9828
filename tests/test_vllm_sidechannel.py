"""A taken NIXL side-channel port stops the connector's engine with a clear error
(:mod:`leaseproto.integrations.vllm.sidechannel`); vLLM 0.32 alone waits forever for a
listener thread whose bind failed. The real engine is in tests/test_vllm_pd.py."""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run has it)")

from vllm_push_stubs import push_scheduler
from vllm_stubs import make_scheduler

from leaseproto.adapters.nixl import free_port
from leaseproto.integrations.vllm import SideChannelPortTaken, sidechannel
from leaseproto.integrations.vllm.sidechannel import SideChannelCheck, check_side_channel

pytestmark = pytest.mark.vllm


@pytest.fixture
def squatted() -> Iterator[int]:
    """A port another process (here: a socket) listens on."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_port_is_named_in_a_typed_error(squatted: int) -> None:
    with pytest.raises(SideChannelPortTaken) as caught:
        check_side_channel("localhost", squatted)
    assert caught.value.errno == errno.EADDRINUSE
    assert f"tcp://localhost:{squatted}" in str(caught.value)
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" in str(caught.value)
    assert isinstance(caught.value, OSError)


def test_the_check_leaves_the_portfree_port() -> None:
    port = free_port()
    check_side_channel("localhost", port)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
        s.bind(("127.0.0.1", port))
        s.listen()


def _scheduler(kind: str, port: int) -> object:
    s = make_scheduler(True) if kind == "pull" else push_scheduler(True, "P0")
    s.side_channel_host, s.side_channel_port = "localhost", port
    s._nixl_handshake_listener_t = None
    s._stop_event = threading.Event()
    return s


@pytest.mark.timeout(30)  # before the check, vLLM waited here for ever
@pytest.mark.parametrize("kind", ["pull", "push"])
def test_the_schedulers_refuse_to_start_on_a_taken_port(kind: str, squatted: int) -> None:
    s = _scheduler(kind, squatted)
    before = threading.active_count()
    with pytest.raises(SideChannelPortTaken):
        s.set_xfer_handshake_metadata({})  # type: ignore[attr-defined]
    assert s._nixl_handshake_listener_t is None  # type: ignore[attr-defined]
    assert threading.active_count() == before  # no listener thread was started


@pytest.mark.timeout(60)  # vLLM waits for its listener without a timeout
@pytest.mark.parametrize("kind", ["pull", "push"])
def test_on_a_free_port_vllm_s_listener_binds_after_the_check(kind: str) -> None:
    s = _scheduler(kind, free_port())
    s.set_xfer_handshake_metadata({})  # type: ignore[attr-defined]
    try:
        listener = s._nixl_handshake_listener_t  # type: ignore[attr-defined]
        assert listener is not None and listener.is_alive()
        with pytest.raises(SideChannelPortTaken):  # vLLM's listener holds it now
            check_side_channel("localhost", s.side_channel_port)  # type: ignore[attr-defined]
    finally:
        s._stop_event.set()  # type: ignore[attr-defined]
        s._nixl_handshake_listener_t.join(5)  # type: ignore[attr-defined]


class _OtherVllmScheduler:
    """A scheduler of a vLLM whose NIXL scheduler lacks 0.32's private attributes."""

    def __init__(self) -> None:
        self.metadata: list[object] = []

    def set_xfer_handshake_metadata(self, metadata: object) -> None:
        self.metadata.append(metadata)


class _Checked(SideChannelCheck, _OtherVllmScheduler):
    pass


def test_a_vllm_without_the_attributes_starts_as_it_would_without_the_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sidechannel, "_warned", set())
    s = _Checked()
    with caplog.at_level(logging.WARNING, logger="vllm.leaseproto.scheduler"):
        s.set_xfer_handshake_metadata({"a": 1})
        s.set_xfer_handshake_metadata({"b": 2})
    assert s.metadata == [{"a": 1}, {"b": 2}]  # vLLM's own method ran, no AttributeError
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "_nixl_handshake_listener_t" in warned[0]
    assert "side_channel_host" in warned[0] and "not checked" in warned[0]


def test_with_the_attributes_but_a_listener_already_up_nothing_is_bound_again(
    squatted: int,
) -> None:
    s = _Checked()
    s.side_channel_host, s.side_channel_port = "localhost", squatted  # type: ignore[attr-defined]
    s._nixl_handshake_listener_t = object()  # type: ignore[attr-defined]  # vLLM's, running
    s.set_xfer_handshake_metadata({})  # the port is held by that listener: no refusal
    assert s.metadata == [{}]
