"""Names bound to addresses, forgetting and pushing again, on real NIXL agents
in one process (spec §10.2; :mod:`leaseproto.adapters.nixl`): a decode-side
endpoint refuses metadata pushed under a name it never fetched, so a squatter
under P's name hears nothing; an endpoint that forgot a peer drops its
notifications until the peer, idle for ``repush_idle``, pushes again."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nixl_mod = pytest.importorskip("leaseproto.adapters.nixl")
try:
    nixl_mod.load_nixl()
except ImportError as exc:  # pragma: no cover - CI installs NIXL
    pytest.skip(f"NIXL is not importable: {exc}", allow_module_level=True)

from leaseproto.adapters.nixl import NixlEndpoint, XferDescs, free_port  # noqa: E402


def _wait(pred: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def _received(ep: NixlEndpoint, sender: str, payload: bytes) -> bool:
    return (sender, payload) in ep.poll()


@pytest.fixture
def p() -> Iterator[tuple[NixlEndpoint, XferDescs]]:
    ep = NixlEndpoint(f"p-{secrets.token_hex(3)}", port=free_port(), progress_thread=True)
    pool = torch.zeros(4096, dtype=torch.uint8)
    ep.register([pool])
    yield ep, XferDescs("DRAM", ((pool.data_ptr(), 256, 0),))
    ep.close()


def test_a_squatter_under_ps_name_is_refused_and_hears_nothing(
    p: tuple[NixlEndpoint, XferDescs],
) -> None:
    real, probe = p
    d = NixlEndpoint(
        f"d-{secrets.token_hex(3)}", port=free_port(), progress_thread=True, accept_pushed=False
    )
    squatter = NixlEndpoint(real.name, port=free_port(), progress_thread=True)
    try:
        squatter.connect(d.name, "127.0.0.1", d.port)  # pushes its metadata, named as P, to D
        time.sleep(0.5)  # D's listener loads it
        assert d.connection_state(real.name) == "unknown"  # pushed, never fetched: refused
        assert d.stats.pushes_refused == 1
        squatter._push_metadata(d.name, squatter._peers[d.name])  # again, before D's fetch
        time.sleep(0.5)
        d.connect(real.name, "127.0.0.1", real.port, probe=probe)
        _wait(lambda: d.is_connected(real.name), "D's handshake with the real P")
        assert d.stats.pushes_refused == 2
        assert d.send(real.name, b"HB:hello")
        _wait(lambda: _received(real, d.name, b"HB:hello"), "the real P to hear D")
        time.sleep(0.2)
        assert squatter.poll() == []
    finally:
        squatter.close()
        d.close()


def test_a_probe_the_loaded_metadata_does_not_cover_is_fetched_again(
    p: tuple[NixlEndpoint, XferDescs],
) -> None:
    real, probe = p
    d = NixlEndpoint(f"d-{secrets.token_hex(3)}", port=free_port(), progress_thread=True)
    try:
        elsewhere = XferDescs("DRAM", ((probe.descs[0][0] + (1 << 40), 256, 0),))
        d.connect(real.name, "127.0.0.1", real.port, probe=elsewhere)
        time.sleep(1.0)  # loaded, but it does not cover what the peer said it serves
        assert not d.is_connected(real.name)
        assert d.stats.names_refetched >= 1
    finally:
        d.close()


def test_a_forgotten_peer_is_dropped_until_it_pushes_again(
    p: tuple[NixlEndpoint, XferDescs],
) -> None:
    real, probe = p
    idle = 0.5
    d = NixlEndpoint(
        f"d-{secrets.token_hex(3)}",
        port=free_port(),
        progress_thread=True,
        accept_pushed=False,
        repush_idle=idle,
    )
    try:
        d.connect(real.name, "127.0.0.1", real.port, probe=probe)
        _wait(lambda: d.is_connected(real.name) and real.is_connected(d.name), "the handshake")
        real.forget(d.name)
        assert real.connection_state(d.name) == "unknown" and real.stats.forgotten == 1
        time.sleep(idle)  # D sent nothing for repush_idle: its next send pushes first
        assert d.send(real.name, b"HB:back")
        assert d.stats.repushes == 1
        _wait(lambda: real.is_connected(d.name), "P to know D again")
        _wait(lambda: _received(real, d.name, b"HB:back"), "P to hear D")
        assert d.send(real.name, b"HB:soon")  # right after: no second push
        assert d.stats.repushes == 1
    finally:
        d.close()
