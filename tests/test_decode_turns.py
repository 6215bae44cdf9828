"""D as a grantor of its cached turns (:class:`TurnGrants`), in memory: the
lease (``decoder_kv_blocks_ttl``, capped by ``max_lease_lifetime``), P's
hello, renewals and transfer-done handled by P's own grant code with an OK
verdict and the blocks freed (I14's grantor side), another agent refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from leaseproto import LeaseConfig
from leaseproto.core import wire
from leaseproto.toymodel.tiny_decoder import TinyDecoder
from leaseproto.workers.decode_state import DecodeOptions, Req, hello
from leaseproto.workers.decode_turns import TurnGrants, for_grantor
from leaseproto.workers.messages import RankParams
from leaseproto.workers.notifications import DropLog, NotificationGate

P_AGENT = "prefill-engine-r0-aaaaaa"


class _Trace:
    enabled = False

    def emit(self, ev: str, **fields: Any) -> None:
        pass

    def release(self, rel: Any, n: int) -> None:
        pass

    def expire(self, now: float, n: int) -> None:
        pass


class FakeBackend:
    agent_name = "decode-r0-bbbbbb"
    nixl_port = 1
    frame_overhead = 0

    def __init__(self) -> None:
        self.pool = TinyDecoder(seed=0).make_pool(16, 4, device="cpu")
        self.sent: list[tuple[str, bytes]] = []
        self.trace = _Trace()

    def send(self, agent: str, payload: bytes) -> bool:
        self.sent.append((agent, payload))
        return True

    def free(self, blocks: list[int]) -> None:
        self.pool.free(blocks)

    def layout(self) -> dict[str, Any]:
        return self.pool.layout()

    def take_lost_peers(self) -> list[tuple[str, str]]:
        raise AssertionError("lost peers are the decode worker's reader side's, not the grantor's")

    @property
    def num_free(self) -> int:
        return self.pool.num_free


def turns(config: LeaseConfig) -> tuple[TurnGrants, FakeBackend]:
    backend = FakeBackend()
    gate = NotificationGate(DropLog(logging.getLogger("t")), known=lambda a: True)
    opts = DecodeOptions(config=config)
    return TurnGrants(opts, backend, gate), backend  # type: ignore[arg-type]


def finished(backend: FakeBackend) -> Req:
    rank = RankParams(rank=0, tp=1, agent=P_AGENT, host="h", nixl_port=2, block_ids=(0,), layout={})
    req = Req([], "c.0-1", [1, 2, 3, 4, 5], 4, "c.0-1", "p", [rank], 9, 5, 0.0)
    req.blocks = backend.pool.allocate(backend.pool.blocks_needed(5 + 4 - 1))
    return req


@pytest.mark.parametrize(("cap", "lease"), [(None, 8.0), (5.0, 5.0)])
def test_the_cached_turn_lease_is_the_ttl_capped_by_the_max_lifetime(
    cap: float | None, lease: float
) -> None:
    t, backend = turns(LeaseConfig(3.0, 8.0, max_lease_lifetime=cap))
    cache = t.keep(finished(backend))
    assert cache is not None
    assert cache["num_tokens"] == 8  # prompt + the tokens but the last
    assert cache["ranks"][0]["block_ids"] == t.grants.blocks[cache["remote_req_id"]]
    assert cache["ranks"][0]["lease_remaining"] == pytest.approx(lease, abs=0.5)


def test_I14_p_transfer_done_gets_ok_and_frees_the_blocks_another_agent_is_refused() -> None:
    t, backend = turns(LeaseConfig(3.0, 8.0))
    cache = t.keep(finished(backend))
    assert cache is not None
    lease = cache["remote_req_id"]
    assert backend.pool.num_free == 14
    msgs = [hello(), *wire.encode_heartbeat([lease]), wire.encode_transfer_done(lease, 1)]
    assert all(for_grantor(m) for m in msgs) and not for_grantor(wire.encode_ok(lease))
    t.grant_step([("decode-r9-cccccc", wire.encode_transfer_done(lease, 1))])  # not bound
    assert backend.pool.num_free == 14 and t.grants.binding.refused["transfer_done"] == 1
    t.grant_step([(P_AGENT, m) for m in msgs])
    assert (P_AGENT, wire.encode_ok(wire.CAPABILITY)) in backend.sent
    assert (P_AGENT, wire.encode_ok(lease)) in backend.sent
    assert backend.pool.num_free == 16 and len(t.grants.table) == 0
    assert t.stats()["turn_table"]["released_transferred"] == 1
