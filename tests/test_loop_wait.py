"""How a worker's loop waits (``workers.loop.wait_for_input``): on its request
socket alone when it expects no notification, and on the NIXL endpoint's
poll-and-sleep, which also looks at the request socket, when it expects one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from leaseproto.workers.loop import wait_for_input


class _Endpoint:
    """Records each wait and what ``until`` said then."""

    def __init__(self) -> None:
        self.waits: list[tuple[float, bool]] = []

    def wait(self, timeout: float, *, until: Callable[[], bool] | None = None) -> bool:
        assert until is not None
        said = until()
        self.waits.append((timeout, said))
        return said


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    client = ctx.socket(zmq.DEALER)
    client.connect(f"tcp://127.0.0.1:{port}")
    yield server, client
    client.close(0)
    server.close(0)
    ctx.term()


def test_expecting_a_notification_waits_on_the_endpoint_which_sees_requests(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    server, client = pair
    ep = _Endpoint()
    wait_for_input(server, 0.001, ep)  # type: ignore[arg-type]
    assert ep.waits == [(0.001, False)]  # no request yet
    client.send(b"request")
    assert server.poll(5000, zmq.POLLIN)
    wait_for_input(server, 0.001, ep)  # type: ignore[arg-type]
    assert ep.waits[-1] == (0.001, True)  # the request ends the endpoint's wait
    assert server.recv_multipart()[-1] == b"request"  # and is still there to receive


def test_expecting_none_blocks_on_the_socket_alone(
    pair: tuple[zmq.Socket[bytes], zmq.Socket[bytes]],
) -> None:
    server, client = pair
    t0 = time.monotonic()
    wait_for_input(server, 0.02)
    assert time.monotonic() - t0 >= 0.015  # the whole timeout: nothing came
    client.send(b"request")
    wait_for_input(server, 30.0)  # returns when it arrives
    assert server.recv_multipart()[-1] == b"request"
