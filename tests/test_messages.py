"""Request-plane messages decode into typed structs (msgspec); a bad field is a
BadMessage naming it, and the router answers a bad ``generate`` with it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("msgspec")
pytest.importorskip("zmq")

from leaseproto.workers.messages import (
    Decode,
    Generate,
    Prefill,
    RankParams,
    parse,
)
from leaseproto.workers.plane import BadMessage, call

RANK: dict[str, Any] = {
    "rank": 0,
    "tp": 1,
    "agent": "p-r0",
    "host": "127.0.0.1",
    "nixl_port": 17000,
    "block_ids": [3, 4],
    "layout": {"heads": 2},
    "lease_remaining": 2.5,
    "first_token": 7,
    "engine_id": "prefill-engine",  # P sends more keys than D reads: ignored
}


def test_good_messages_parse() -> None:
    g = parse({"op": "generate", "id": "a", "prompt": [1, 2]}, Generate)
    assert g.prompt == [1, 2] and g.max_tokens == 8
    assert parse({"op": "prefill", "req_id": "r", "prompt": [1]}, Prefill).d_tp == 1
    d = parse(
        {
            "op": "decode",
            "req_id": "r",
            "prompt": [1, 2, 3],
            "max_tokens": 4,
            "params": {"remote_req_id": "r", "engine_id": "e", "ranks": [RANK]},
        },
        Decode,
    )
    assert d.params.ranks[0].block_ids == (3, 4) and d.params.ranks[0].lease is None


@pytest.mark.parametrize(
    ("msg", "where"),
    [
        ({"prompt": []}, "$.prompt"),
        ({"prompt": [1, True]}, "$.prompt[1]"),
        ({"prompt": [1, -2]}, "$.prompt[1]"),
        ({"prompt": "12"}, "$.prompt"),
        ({"prompt": [1], "max_tokens": 0}, "$.max_tokens"),
        ({"prompt": [1], "max_tokens": 2.5}, "$.max_tokens"),
        ({}, "prompt"),
    ],
)
def test_bad_generate_names_the_field(msg: dict[str, Any], where: str) -> None:
    with pytest.raises(BadMessage, match="bad generate message") as err:
        parse({"op": "generate", **msg}, Generate)
    assert where in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "where"),
    [
        ("nixl_port", 0, "$.nixl_port"),
        ("nixl_port", 70000, "$.nixl_port"),
        ("block_ids", [1, "2"], "$.block_ids[1]"),
        ("agent", "", "$.agent"),
        ("layout", [], "$.layout"),
        ("lease_remaining", "soon", "$.lease_remaining"),
        (
            "leaseproto",
            {"v": 1, "lease": {"kv_lease_duration": 0, "lease_extension": 2}},
            "kv_lease_duration",
        ),
    ],
)
def test_bad_transfer_parameter_names_the_field(key: str, value: object, where: str) -> None:
    with pytest.raises(BadMessage) as err:
        parse({**RANK, key: value}, RankParams)
    assert where in str(err.value)


def test_rank_params_round_trip_to_followers() -> None:
    adv = {"v": 1, "lease": {"kv_lease_duration": 3.0, "lease_extension": 2.0}}
    r = parse({**RANK, "leaseproto": adv}, RankParams)
    again = parse(r.as_msg(), RankParams)
    assert again == r and again.lease is not None and again.lease.lease_extension == 2.0


def test_router_answers_a_bad_generate_with_the_field() -> None:
    from leaseproto.workers.router import Router, RouterOptions

    router = Router(
        RouterOptions(prefill=["tcp://127.0.0.1:1"], decode="tcp://127.0.0.1:2", metrics_port=None)
    )
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            router.step(timeout_ms=10)

    t = threading.Thread(target=loop)
    t.start()
    try:
        address = f"tcp://127.0.0.1:{router.server.port}"
        bad = {"op": "generate", "id": 5, "prompt": [1, "x"], "max_tokens": 2}
        answer = call(address, bad, timeout=10.0)
        assert answer["op"] == "result" and answer["id"] == 5 and not answer["ok"]
        assert "$.prompt[1]" in answer["error"] and "Expected `int`" in answer["error"]
    finally:
        stop.set()
        t.join()
        router.close()


# -- the bytes: one msgspec decoder -------------------------------------------------------
def test_decode_round_trip_and_what_it_refuses() -> None:
    from leaseproto.workers.plane import decode, encode

    msg = {"op": "prefilled", "block_ids": [1, 2], "layout": {"heads": 2}, "x": b"\x00", "f": 0.5}
    assert decode(encode(msg)) == msg
    import msgspec

    for data, why in [
        (b"\xc1", "not msgpack"),  # a byte msgpack never uses
        (encode({"op": "x"})[:-1], "not msgpack"),  # cut short
        (msgspec.msgpack.encode([1, 2]), "expected a map with a string 'op'"),
        (msgspec.msgpack.encode({1: "op"}), "expected a map with a string 'op'"),
        (msgspec.msgpack.encode({"op": 5}), "expected a map with a string 'op'"),
        (msgspec.msgpack.encode({"id": "a"}), "expected a map with a string 'op'"),
    ]:
        with pytest.raises(BadMessage, match=why):
            decode(data)


def test_the_request_plane_needs_no_msgpack_package() -> None:
    """The serve extra no longer installs msgpack: msgspec reads and writes the bytes."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['msgpack'] = None\n"
        "from leaseproto.workers import messages, plane\n"
        "m = plane.decode(plane.encode({'op': 'generate', 'prompt': [1, 2], 'max_tokens': 3}))\n"
        "assert messages.parse(m, messages.Generate).max_tokens == 3\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
