"""The cluster key file and the request plane's CURVE (spec §10.3): a bad
file is a clear start-up error; a worker says once whether its control plane
is authenticated; a CURVE server answers only a client holding the cluster's
key pair (not one that merely knows the server's public key); options that
cannot work with a key are refused."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")

from leaseproto import LeaseConfig  # noqa: E402
from leaseproto.core.mac import ClusterKey  # noqa: E402
from leaseproto.harness.client import RouterClient  # noqa: E402
from leaseproto.workers.keys import CurveKeys, announce, load_cluster_key  # noqa: E402
from leaseproto.workers.loop import RankOptions  # noqa: E402
from leaseproto.workers.plane import Server, call  # noqa: E402

KEY = ClusterKey.from_bytes(b"a test cluster key of 32 bytes!!")


def test_a_key_file_is_read_and_its_problems_named(tmp_path: Path) -> None:
    good = tmp_path / "k"
    good.write_bytes(b"a test cluster key of 32 bytes!!\n")
    good.chmod(0o600)
    key = load_cluster_key(good)
    assert key is not None and key.key_id == KEY.key_id
    assert load_cluster_key(None) is None
    with pytest.raises(ValueError, match="cannot read the cluster key file"):
        load_cluster_key(tmp_path / "missing")
    short = tmp_path / "short"
    short.write_text("too short\n")
    with pytest.raises(ValueError, match=f"{short}.*at least 16 bytes"):
        load_cluster_key(short)


def test_a_key_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "k"
    f.write_bytes(b"a test cluster key of 32 bytes!!")
    f.chmod(0o644)
    with caplog.at_level(logging.WARNING, "leaseproto.auth"):
        load_cluster_key(f)
    assert "can be read by other users" in caplog.text


def test_a_worker_says_whether_its_control_plane_is_authenticated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, "leaseproto.auth"):
        announce("prefill rank 0", None)
        announce("decode rank 0", KEY)
    unauth = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(unauth) == 1 and unauth[0].levelno == logging.WARNING
    assert KEY.key_id in caplog.records[1].getMessage()
    assert "a test cluster key" not in caplog.text


@pytest.fixture
def server() -> Iterator[Server]:
    ctx = zmq.Context()
    srv = Server(ctx, "127.0.0.1", 0, curve=CurveKeys.from_key(KEY))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            got = srv.recv()
            if got is not None:
                srv.reply(got[0], {"op": "pong"})
            time.sleep(0.005)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        stop.set()
        t.join()
        srv.close()
        ctx.term()


def test_a_curve_server_answers_only_the_cluster(server: Server) -> None:
    address = f"tcp://127.0.0.1:{server.port}"
    ours = CurveKeys.from_key(KEY)
    assert call(address, {"op": "ping"}, timeout=5.0, curve=ours)["op"] == "pong"
    with pytest.raises(TimeoutError):
        call(address, {"op": "ping"}, timeout=0.5)  # no CURVE at all
    other = CurveKeys.from_key(ClusterKey.from_bytes(b"some other cluster key, 32 bytes"))
    with pytest.raises(TimeoutError):
        call(address, {"op": "ping"}, timeout=0.5, curve=other)
    # knowing the server's public key is not enough: the ZAP check wants the cluster's pair
    public, secret = zmq.curve_keypair()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = ours.public
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.setsockopt(zmq.SNDTIMEO, 500)  # a refused handshake can block the send for good
        sock.connect(address)
        with contextlib.suppress(zmq.Again):
            sock.send(b"\x81\xa2op\xa4ping")
        assert not sock.poll(500, zmq.POLLIN)
    finally:
        sock.close(0)
    assert server.zap is not None and server.zap.refused >= 1


def test_a_call_the_server_refused_before_it_sent_times_out(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DEALER whose handshake a keyed server refused before it sent anything can
    block in ``send`` for good (libzmq has dropped the connection's pipe: about 3 times
    in 10 here). ``call`` raises ``TimeoutError`` within its timeout all the same,
    never hangs. The refusal is made to come first, as on a loaded machine."""
    address = f"tcp://127.0.0.1:{server.port}"
    connect = zmq.Socket.connect

    def connect_then_wait(self: zmq.Socket[bytes], addr: str) -> Any:
        out = connect(self, addr)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(zmq.Socket, "connect", connect_then_wait)
    client_took: list[float] = []  # RouterClient.submit: the same send, its own timeout

    def submits() -> None:
        for i in range(16):
            client = RouterClient(address, send_timeout=0.2)
            started = time.monotonic()
            try:
                client.submit(f"r{i}", [1, 2, 3], 4)
            except TimeoutError:
                assert f"r{i}" not in client.sent  # not counted as sent
            client_took.append(time.monotonic() - started)
            client.close()

    t = threading.Thread(target=submits, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"submit blocked in send, after {len(client_took)}: {client_took}"
    assert len(client_took) == 16 and max(client_took) < 0.2 + 2.0, client_took
    took: list[float] = []  # each call's seconds, the 0.3 s in connect included

    def calls() -> None:
        for _ in range(16):  # a send that never blocks in 16 tries: 0.7 ** 16, 0.3%
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                call(address, {"op": "ping"}, timeout=0.2)  # no CURVE at all
            took.append(time.monotonic() - started)

    t = threading.Thread(target=calls, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f"call blocked in send, after {len(took)} calls: {took}"
    assert len(took) == 16 and max(took) < 0.3 + 0.2 + 2.0, took


def test_options_that_cannot_work_with_a_key_are_refused() -> None:
    with pytest.raises(ValueError, match="policy 'lease'"):
        RankOptions(LeaseConfig(3.0), policy="fixed", cluster_key=KEY).check()
    small = LeaseConfig(3.0, max_notification_bytes=560)
    RankOptions(small).check()  # fine without a key
    with pytest.raises(ValueError, match="max_notification_bytes must be at least 585"):
        RankOptions(small, cluster_key=KEY).check()


def test_decode_refuses_a_p_whose_key_differs_from_its_own() -> None:
    from leaseproto.core.peer import advertisement
    from leaseproto.workers.keys import key_mismatch
    from leaseproto.workers.messages import RankParams

    def rank(auth: str | None, *, advertised: bool = True) -> RankParams:
        advert = {**advertisement(LeaseConfig(3.0)), **({} if auth is None else {"auth": auth})}
        return RankParams(
            rank=0,
            tp=1,
            agent="p-r0",
            host="127.0.0.1",
            nixl_port=5000,
            block_ids=(0,),
            layout={},
            advert=advert if advertised else None,
        )

    other = ClusterKey.from_bytes(b"some other cluster key, 32 bytes")
    assert key_mismatch([rank(KEY.key_id)], KEY) is None
    assert key_mismatch([rank(None)], None) is None
    assert key_mismatch([rank(None, advertised=False)], KEY) is None  # stock P: unsealed
    assert "advertised no cluster key" in str(key_mismatch([rank(None)], KEY))
    assert f"advertised cluster key {other.key_id}" in str(key_mismatch([rank(other.key_id)], KEY))
    assert "this decoder has none" in str(key_mismatch([rank(KEY.key_id)], None))
