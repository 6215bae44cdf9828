"""P's reads of D's cached turns (:class:`PrefixReads`), in memory: the fence
(I14: the prefix is used only after OK from every D agent read; NK, LL, no
verdict in time, the gate or a silent D → recompute, counted and traced),
and P's heartbeats for a waiting turn-2 request (I16)."""

from __future__ import annotations

import logging
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("msgspec")

from leaseproto import LeaseConfig, LeaseTable
from leaseproto.adapters.xfer import Transfer
from leaseproto.core import wire
from leaseproto.toymodel.tiny_decoder import TinyDecoder
from leaseproto.workers.messages import TransferParams, parse
from leaseproto.workers.notifications import DropLog
from leaseproto.workers.prefill_leases import LeaseGrants
from leaseproto.workers.prefill_prefix import PrefixReads

CONFIG = LeaseConfig(3.0, 2.0, safety_margin=0.2)
D_AGENTS = ("decode-r0-aaaaaa",)


class _Trace:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, ev: str, **fields: Any) -> None:
        self.events.append((ev, fields))


class FakeBackend:
    """What PrefixReads asks of KVBackend: every agent connected, READs done
    when the test says, sends recorded."""

    frame_overhead = 0

    def __init__(self) -> None:
        self.staging = TinyDecoder(seed=0).make_pool(16, 4, device="cpu")
        self.sent: list[tuple[str, bytes]] = []
        self.reads: list[Transfer] = []
        self.trace = _Trace()

    def connect(self, agent: str, host: str, port: int, *, keyed: bool = False) -> None:
        pass

    def is_connected(self, agent: str) -> bool:
        return True

    def ready(self, agent: str) -> bool:
        return True

    def send(self, agent: str, payload: bytes) -> bool:
        self.sent.append((agent, payload))
        return True

    def read_plan(self, ranks: Any, blocks: Any, num_tokens: int, *, into: str) -> list[Any]:
        assert into == "staging"
        return [(r, None, None) for r in ranks]

    def read(self, agent: str, local: Any, remote: Any, *, notif_msg: bytes) -> Transfer:
        x = Transfer(agent, notif_msg, 0, handle=None, state="PROC")
        self.reads.append(x)
        return x

    def transfer_state(self, x: Transfer) -> str:
        return x.state

    def release(self, x: Transfer) -> None:
        pass

    def finish_reads(self) -> None:
        for x in self.reads:
            x._state = "DONE"


def params(
    remaining: float = 2.0, agents: tuple[str, ...] = D_AGENTS, lease: str = "turn-0123456789abcdef"
) -> TransferParams:
    ranks = [
        {
            "rank": i,
            "tp": len(agents),
            "agent": a,
            "host": "127.0.0.1",
            "nixl_port": 5000 + i,
            "block_ids": [3, 4],
            "layout": {},
            "lease_remaining": remaining,
        }
        for i, a in enumerate(agents)
    ]
    msg = {"remote_req_id": lease, "engine_id": "d", "ranks": ranks}
    return parse(msg, TransferParams)


def reads(
    agents: tuple[str, ...] = D_AGENTS, remaining: float = 2.0, p_tp: int = 2, **kw: Any
) -> tuple[Any, Any]:
    """``PrefixReads`` (``kw``: its options) tracking ``r1``'s prefix, and its backend."""
    backend = FakeBackend()
    pr = PrefixReads(
        backend,  # type: ignore[arg-type]
        CONFIG,
        p_tp=p_tp,
        notes=DropLog(logging.getLogger("test")),
        **kw,
    )
    pr.track("r1", params(remaining, agents), 7, now=0.0)
    return pr, backend


def greet(pr: PrefixReads, agents: tuple[str, ...] = D_AGENTS, now: float = 0.0) -> None:
    pr.step(now=now)  # hellos (and the first heartbeat)
    for a in agents:
        assert pr.verdict(a, wire.decode(wire.encode_ok(wire.CAPABILITY)))


def test_I16_heartbeats_d_from_queue_entry_and_stops_after_the_read() -> None:
    pr, backend = reads()
    pr.step(now=0.0)
    hb = [p for _, p in backend.sent if p == b"HB:turn-0123456789abcdef"]
    assert hb, backend.sent  # at queue entry
    pr.step(now=0.1)
    assert len([p for _, p in backend.sent if p == hb[0]]) == 1  # throttled: one per H
    pr.step(now=CONFIG.heartbeat_interval + 0.01)
    assert len([p for _, p in backend.sent if p == hb[0]]) == 2
    greet(pr, now=0.6)
    p = pr.get("r1")
    assert p is not None
    pr.start(p, now=0.7)
    assert backend.reads[0].notif_msg == b"turn-0123456789abcdef:2"  # n = P's TP
    backend.finish_reads()
    pr.step(now=0.8)
    sent = len(backend.sent)
    pr.step(now=5.0)  # read done: no more heartbeats for it
    assert not [x for _, x in backend.sent[sent:] if x.startswith(b"HB:turn")]


def test_I14_the_prefix_is_used_only_after_ok_from_every_d_agent() -> None:
    agents = ("decode-r0-aaaaaa", "decode-r1-bbbbbb")
    pr, backend = reads(agents)
    greet(pr, agents)
    p = pr.get("r1")
    assert p is not None
    pr.start(p, now=0.1)
    backend.finish_reads()
    pr.step(now=0.2)
    ok = wire.decode(wire.encode_ok(p.lease_id))
    assert pr.verdict("decode-r9-cccccc", ok)  # a foreign agent's OK does not count
    assert pr.counts["prefix_foreign"] == 1
    pr.verdict(agents[0], ok)
    assert p.state == "verifying"
    pr.verdict(agents[1], ok)
    assert p.state == "ok"
    use = [f for k, f in backend.trace.events if k == "use"]
    assert use == [{"req": "r1", "kind": "prefix", "remote": p.lease_id, "ok_from": list(agents)}]
    assert pr.done("r1") == {"tokens": 7, "verified": True, "recomputed": None}
    assert backend.staging.num_free == backend.staging.num_blocks


@pytest.mark.parametrize("how", ["nack", "timeout", "ll", "gate", "silent"])
def test_I14_without_ok_the_prefix_is_recomputed(how: str) -> None:
    pr, backend = reads(remaining=10.0 if how == "silent" else 2.0)
    p = pr.get("r1")
    assert p is not None
    if how == "silent":
        pr.step(now=0.0)
        pr.start(p, now=CONFIG.lease_extension + 0.1)  # D never answered the hello
    elif how == "ll":
        pr.verdict(D_AGENTS[0], wire.decode(wire.encode_lease_lost(p.lease_id, "expired")))
    elif how == "gate":  # the last heartbeat (at 0) moved D's deadline to 0 + extension
        greet(pr)
        pr.start(p, now=CONFIG.lease_extension - CONFIG.safety_margin + 0.01)
    else:
        greet(pr)
        pr.start(p, now=0.1)
        backend.finish_reads()
        pr.step(now=0.2)
        if how == "nack":
            pr.verdict(D_AGENTS[0], wire.decode(wire.encode_nack(p.lease_id, "expired")))
        else:
            pr.step(now=0.2 + CONFIG.lease_extension + 0.01)
    reason = {"ll": "lost", "silent": "lost"}.get(how, how)
    assert p.state == "lost" and p.reason == reason
    assert pr.counts[f"prefix_recomputed_{reason}"] == 1
    assert ("recompute", {"req": "r1", "reason": reason, "remote": p.lease_id}) in (
        backend.trace.events
    )
    assert not [k for k, _ in backend.trace.events if k == "use"]
    aborted = (D_AGENTS[0], wire.encode_abort(p.lease_id)) in backend.sent
    assert aborted == (how != "nack")  # D is told unless its lease had ended already
    assert pr.done("r1") == {"tokens": 7, "verified": False, "recomputed": reason}
    assert backend.staging.num_free == backend.staging.num_blocks


def test_gate_only_reads_as_vllm_no_heartbeat_no_hello_no_verdict() -> None:
    pr, backend = reads(p_tp=1, gate_only=True)
    p = pr.get("r1")
    assert p is not None
    for now in (0.0, 0.6, 1.2):  # nothing renews D's lease, nobody is greeted
        pr.step(now=now)
    assert backend.sent == []
    pr.start(p, now=1.2)  # 0.8 s left > margin 0.2: vLLM's gate admits
    assert [x.notif_msg for x in backend.reads] == [b"turn-0123456789abcdef:1"]
    backend.finish_reads()
    pr.step(now=1.3)
    assert p.state == "ok"  # used as read: no OK awaited
    assert pr.counts["prefix_unverified"] == 1 and pr.counts["prefix_verified"] == 0
    use = [f for k, f in backend.trace.events if k == "use"]
    assert use == [{"req": "r1", "kind": "prefix", "remote": p.lease_id, "ok_from": []}]
    assert pr.done("r1") == {"tokens": 7, "verified": False, "recomputed": None}


def test_gate_only_gate_refuses_without_telling_d() -> None:
    pr, backend = reads(p_tp=1, gate_only=True)
    p = pr.get("r1")
    assert p is not None
    pr.start(p, now=2.0 - CONFIG.safety_margin)  # now + margin reaches the deadline
    assert p.state == "lost" and p.reason == "gate"
    assert backend.reads == [] and backend.sent == []  # vLLM sends D nothing


def test_a_stall_at_the_gate_holds_the_read_and_its_heartbeats_then_posts_it() -> None:
    pr, backend = reads(p_tp=1, stall_at_gate=3.0, stalls=1)
    pr.track("r2", params(lease="turn-2"), 7, now=0.0)
    greet(pr)
    p1, p2 = pr.get("r1"), pr.get("r2")
    assert p1 is not None and p2 is not None
    pr.start(p1, now=0.1)
    assert p1.admitted and backend.reads == []  # admitted, not read
    assert ("stall", {"req": "r1", "remote": p1.lease_id, "seconds": 3.0}) in backend.trace.events
    sent = len(backend.sent)
    pr.step(now=CONFIG.heartbeat_interval + 0.2)
    beats = [x for _, x in backend.sent[sent:] if x.startswith(b"HB:")]
    assert beats == [b"HB:turn-2"]  # the stalled read gets none; the one still queued does
    pr.start(p1, now=3.0)
    assert backend.reads == []
    pr.start(p1, now=3.1)  # the stall is over: the READ goes out, the gate is not asked again
    assert [x.notif_msg for x in backend.reads] == [b"turn-0123456789abcdef:1"]
    pr.start(p2, now=0.5)  # only the first read admitted stalls
    assert len(backend.reads) == 2


def test_p_keeps_the_d_agents_whose_turns_it_reads() -> None:
    """Found under load in the I14 stall test: P's grant side forgot a D agent
    (bound to no live lease of P, silent for two extensions) while P's READ of
    that D's cached turn was in flight; NIXL failed the READ (the remote agent
    was invalidated) and the prefix was recomputed for no reason of D's. The
    agents of every prefix P works on are kept; once it is done they may go."""
    pr, backend = reads()
    assert pr.agents_in_use() == set(D_AGENTS)
    forgotten: list[str] = []
    backend.forget = forgotten.append  # type: ignore[attr-defined]
    grants = LeaseGrants(
        SimpleNamespace(config=CONFIG, policy="lease"),  # type: ignore[arg-type]
        LeaseTable(CONFIG),
        backend,  # type: ignore[arg-type]
        SimpleNamespace(agents_forgotten=SimpleNamespace(inc=lambda n: None)),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]  # the gate: not used here
        drops=DropLog(logging.getLogger("test")),
        notes=DropLog(logging.getLogger("test")),
        in_use=pr.agents_in_use,
    )
    grants.binding.heard(D_AGENTS[0], 0.0)  # D heartbeated P's lease long ago
    grants._now = time.monotonic() + 3600.0  # far past two extensions
    grants._forget_silent()
    assert forgotten == []  # P reads D's turn: D stays
    pr.done("r1")
    assert pr.agents_in_use() == set()
    grants._pruned_at = -math.inf
    grants._forget_silent()
    assert forgotten == [D_AGENTS[0]]
