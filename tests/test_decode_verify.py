"""Who may turn verification on, and whose verdicts count, on the decode
worker's own classes (spec §7.4, §10.2; I13). The worker runs on a stand-in
for its NIXL endpoint, pool and model (:class:`FakeBackend`): P's agents
"connect" at once and answer only what a test tells them to, so each
schedule is exact.

Every test here fails on the decode worker before issue 17: D took "verify
this P's reads" from the engine record the latest decode message made, took
NK and LL from any agent, kept its followers reading after an abort, called
a late NACK for a forgotten request "possibly wrong", and logged every
refused ``stop``.
"""

from __future__ import annotations

import logging
import secrets
from types import SimpleNamespace
from typing import Any

import pytest

for _mod in ("torch", "zmq", "msgspec"):
    pytest.importorskip(_mod)

from leaseproto import LeaseConfig  # noqa: E402
from leaseproto.adapters.xfer import Transfer  # noqa: E402
from leaseproto.core import wire  # noqa: E402
from leaseproto.core.peer import advertisement  # noqa: E402
from leaseproto.workers.decode import DecodeWorker  # noqa: E402
from leaseproto.workers.decode_follower import DecodeFollower  # noqa: E402
from leaseproto.workers.decode_state import DecodeOptions, hello  # noqa: E402
from leaseproto.workers.router import Router, RouterOptions, _Pending  # noqa: E402

BLOCK = 4
P_AGENT = "prefill-r0-aaaaaa"
P_ENGINE = "prefill-engine"
ADVERT = advertisement(LeaseConfig(3.0))


class FakeBackend:
    """What the decode worker asks of :class:`~leaseproto.workers.backend.KVBackend`,
    in memory: every peer is connected, every READ completes when the test
    says, sends are recorded, and the model returns a fixed answer."""

    def __init__(self, agent: str = "decode-r0-ffffff") -> None:
        self.agent_name = agent
        self.nixl_port = 1
        self.sent: list[tuple[str, bytes]] = []
        self.inbox: list[tuple[str, bytes]] = []
        self.reads: list[Transfer] = []
        self.released: list[Transfer] = []
        self.connected: set[str] = set()
        self.free_blocks = list(range(64))
        self.trace = _NoTrace()

    # -- endpoint
    def connect(
        self,
        agent: str,
        host: str,
        port: int,
        *,
        keyed: bool = False,
        layout: dict[str, Any] | None = None,
    ) -> None:
        self.connected.add(agent)

    def is_connected(self, agent: str) -> bool:
        return agent in self.connected

    def ready(self, agent: str) -> bool:  # no cluster key: connected is ready
        return agent in self.connected

    frame_overhead = 0
    #: the NIXL endpoint's counters the worker's stats report (no push is refused here)
    endpoint = SimpleNamespace(stats=SimpleNamespace(pushes_refused=0, names_refetched=0))

    def auth_stats(self) -> dict[str, object]:
        return {}

    def send(self, agent: str, payload: bytes) -> bool:
        self.sent.append((agent, payload))
        return agent in self.connected

    def poll(self) -> list[tuple[str, bytes]]:
        out, self.inbox = self.inbox, []
        return out

    def take_lost_peers(self) -> list[tuple[str, str]]:
        return []

    def read(self, agent: str, local: Any, remote: Any, *, notif_msg: bytes) -> Transfer:
        x = Transfer(agent, notif_msg, 0, handle=None, state="PROC")
        self.reads.append(x)
        return x

    def transfer_state(self, xfer: Transfer) -> str:
        return xfer.state

    def release(self, xfer: Transfer) -> None:
        self.released.append(xfer)

    def read_plan(self, ranks: Any, blocks: Any, num_tokens: int) -> list[Any]:
        return [(r, None, None) for r in ranks]

    # -- pool and model
    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def alloc_for(self, num_tokens: int) -> list[int] | None:
        need = -(-num_tokens // BLOCK)
        if need > len(self.free_blocks):
            return None
        out, self.free_blocks = self.free_blocks[:need], self.free_blocks[need:]
        return out

    def free(self, blocks: Any) -> None:
        self.free_blocks.extend(blocks)

    def check_prompt(self, prompt: Any, max_tokens: int = 1, first_token: Any = None) -> None:
        return None

    def limits(self) -> dict[str, int]:
        return {}

    def prefill(self, prompt: Any, blocks: Any) -> int:
        return 7

    def decode(
        self, blocks: Any, num_tokens: int, first: int, max_tokens: int, *, keep: bool = False
    ) -> list[int]:
        return [first] * max_tokens

    def export_shard(self, blocks: Any, num_tokens: int) -> bytes:
        return b"kv"

    def import_shard(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass

    # -- what the test reads
    def hellos_to(self, agent: str) -> int:
        return sum(1 for a, p in self.sent if a == agent and p == hello())


class _NoTrace:
    enabled = False

    def emit(self, ev: str, **fields: Any) -> None:
        pass


def rank(agent: str = P_AGENT, *, advert: bool = True, r: int = 0, tp: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rank": r,
        "tp": tp,
        "agent": agent,
        "host": "127.0.0.1",
        "nixl_port": 5555,
        "block_ids": [3, 4],
        "layout": {},
        "lease_remaining": 3.0,
        "first_token": 9,
    }
    if advert:
        out["leaseproto"] = ADVERT
    return out


def decode_msg(
    ranks: list[dict[str, Any]], *, remote: str | None = None, engine: str = P_ENGINE
) -> dict[str, Any]:
    return {
        "op": "decode",
        "req_id": f"d-{secrets.token_hex(4)}",
        "prompt": [1, 2, 3, 4, 5, 6],
        "max_tokens": 2,
        "params": {
            "remote_req_id": remote or f"r-{secrets.token_hex(8)}",
            "engine_id": engine,
            "ranks": ranks,
        },
    }


class Harness:
    """A decode worker on a :class:`FakeBackend`, its answers collected."""

    def __init__(self, **opts: Any) -> None:
        self.backend = FakeBackend()
        self.worker = DecodeWorker(
            DecodeOptions(config=LeaseConfig(3.0), metrics_port=None, block_size=BLOCK, **opts),
            backend=self.backend,  # type: ignore[arg-type]
        )
        self.answers: dict[str, dict[str, Any]] = {}
        self.worker.server.reply = self._reply  # type: ignore[method-assign]

    def _reply(self, envelope: list[bytes], msg: dict[str, Any]) -> None:
        self.answers[str(msg.get("req_id"))] = msg

    def submit(self, msg: dict[str, Any]) -> str:
        self.worker._request([b"router"], msg)
        req_id: str = msg["req_id"]
        return req_id

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.worker.step(wait_s=0)

    def greet(self, agent: str = P_AGENT) -> None:
        """P's answer to D's hello."""
        assert self.backend.hellos_to(agent), f"D sent no hello to {agent}"
        self.backend.inbox.append((agent, wire.encode_ok(wire.CAPABILITY)))
        self.step()

    def finish_reads(self) -> None:
        for x in self.backend.reads:
            x._state = "DONE"
        self.step()

    def req(self, req_id: str) -> Any:
        return self.worker.scheduler.running.get(req_id) or next(
            r for r in self.worker.scheduler.waiting if r.req_id == req_id
        )

    def close(self) -> None:
        self.worker.close()


@pytest.fixture
def d() -> Any:
    h = Harness()
    yield h
    h.close()


def test_a_forged_first_message_does_not_keep_verification_off(d: Harness) -> None:
    """A decode message without the advert makes the engine's record first;
    the legitimate request after it still waits for its verdict, and once P
    greeted, no message without the advert goes unverified either."""
    forged = d.submit(decode_msg([rank(advert=False)]))
    legit = d.submit(decode_msg([rank()]))
    assert d.req(legit).verified, "an advertised request's reads are used unverified"
    d.step()
    d.greet()
    d.finish_reads()
    assert d.req(legit).state == "verifying", "read used before P's OK"
    # P greeted: a message that drops the advert no longer turns verification off
    later = d.submit(decode_msg([rank(advert=False)]))
    assert d.req(later).verified
    assert d.worker.stats()["unverified_reads"] == 1  # only the forged first one
    assert forged in d.answers


def test_a_contradicting_message_is_refused_once_p_greeted(d: Harness) -> None:
    """Once P's agent greeted, a decode message naming its engine with other
    ranks (here P's agent twice, so every agent is connected) is refused with
    a clear error, counted, and nothing else changes."""
    legit = d.submit(decode_msg([rank()]))
    d.step()
    d.greet()
    record = d.worker.leases.engines[P_ENGINE]
    doubled = [rank(advert=False, tp=2), rank(advert=False, r=1, tp=2)]
    forged = d.submit(decode_msg(doubled))
    answer = d.answers[forged]
    assert not answer["ok"] and "greeted" in answer["error"], answer
    other_host = rank()
    other_host["host"] = "10.9.9.9"
    forged2 = d.submit(decode_msg([other_host]))
    assert "10.9.9.9" in d.answers[forged2]["error"]
    assert d.worker.leases.engines[P_ENGINE] is record
    assert d.worker.stats()["contradicting_requests"] == 2
    assert d.req(legit).verified and legit not in d.answers


def test_a_contradicting_message_before_the_greeting_is_verified(d: Harness) -> None:
    """Before P greeted, a message that renames the engine's ranks replaces
    D's record of them, but not what D verifies: both the legitimate request
    and the forged one wait for P's verdicts, and P's hello still goes out."""
    legit = d.submit(decode_msg([rank()]))
    doubled = [rank(advert=False, tp=2), rank(advert=False, r=1, tp=2)]
    forged = d.submit(decode_msg(doubled))
    assert d.req(legit).verified and d.req(forged).verified
    d.step()
    d.greet()
    d.finish_reads()
    assert d.req(legit).state == "verifying" and d.req(forged).state == "verifying"
    assert d.worker.stats()["unverified_reads"] == 0


def test_a_restarted_p_is_taken_once_its_old_agent_is_gone(d: Harness) -> None:
    d.submit(decode_msg([rank()]))
    d.step()
    d.greet()
    new = "prefill-r0-bbbbbb"
    alive = d.submit(decode_msg([rank(new)]))
    assert "still answers" in d.answers[alive]["error"]  # the old agent answers
    d.backend.connected.discard(P_AGENT)  # P restarted: its old agent is gone
    restarted = d.submit(decode_msg([rank(new)]))
    assert restarted not in d.answers, d.answers.get(restarted)
    assert d.req(restarted).verified
    assert d.worker.leases.engines[P_ENGINE].agents == (new,)


def test_mixed_adverts_in_one_message_are_refused(d: Harness) -> None:
    mixed = d.submit(decode_msg([rank(tp=2), rank(advert=False, r=1, tp=2)]))
    assert not d.answers[mixed]["ok"]
    assert "some P ranks advertise" in d.answers[mixed]["error"]


@pytest.mark.parametrize("kind", ["nk", "ll", "ok"])
def test_verdicts_count_only_from_the_agents_read(d: Harness, kind: str) -> None:
    """An NK, LL or OK for a request from an agent it does not read from (a
    peer that exchanged metadata with D: the gate lets it through) is
    counted and ignored. (Before issue 17 a foreign NK or LL failed the
    request over; a foreign OK was already ignored, but not counted.)"""
    remote = f"r-{secrets.token_hex(8)}"
    req_id = d.submit(decode_msg([rank()], remote=remote))
    d.step()
    if kind == "ll":  # advisory, and heeded only before the read: P has not greeted yet
        assert d.req(req_id).state == "waiting"
    else:
        d.greet()
        d.finish_reads()
        assert d.req(req_id).state == "verifying"
    evil = "third-agent"
    d.backend.connected.add(evil)
    payload = {
        "nk": wire.encode_nack(remote, "expired"),
        "ll": wire.encode_lease_lost(remote, "expired"),
        "ok": wire.encode_ok(remote),
    }[kind]
    d.backend.inbox.append((evil, payload))
    d.step()
    assert req_id not in d.answers, f"{kind} from {evil} was taken: {d.answers[req_id]}"
    r = d.req(req_id)
    assert not r.recompute and r.needs_remote_kv, f"{kind} from {evil} was taken"
    assert d.worker.stats()["foreign_verdicts"] == 1
    if kind != "ll":
        assert r.state == "verifying" and r.verdicts_due == {P_AGENT}
        d.backend.inbox.append((P_AGENT, wire.encode_ok(remote)))
        d.step(2)
        assert d.answers[req_id]["ok"] and not d.answers[req_id]["recomputed"]


def test_a_p_agent_silent_to_the_hello_costs_a_recompute_not_a_hang(d: Harness) -> None:
    req_id = d.submit(decode_msg([rank()]))
    d.step()
    assert d.backend.hellos_to(P_AGENT)
    later = d.worker.scheduler._clock() + LeaseConfig(3.0).lease_extension + 0.1
    d.worker.scheduler._now = later  # the clock never goes back: this is "now" from here
    d.worker.step(wait_s=0)
    d.step()
    assert d.answers[req_id]["ok"] and d.answers[req_id]["recomputed"]
    assert d.worker.stats()["handshake_timeouts"] >= 1
    assert not d.backend.reads, "read from a P agent that never answered the hello"


def test_an_abort_stops_the_followers_read(d: Harness) -> None:
    """The router's abort during a read: rank 0 stops heartbeating it, sends
    AB: to P, and tells its followers to drop their reads unfinished."""
    told: list[dict[str, Any]] = []

    class Peer:
        def send(self, msg: dict[str, Any]) -> bool:
            told.append(msg)
            return True

        def recv(self) -> None:
            return None

        def disconnected(self) -> bool:
            return False

        def close(self) -> None:
            pass

    d.worker.followers.peers = [Peer()]  # type: ignore[list-item]
    d.worker.opts.tp = 2
    req_id = d.submit(decode_msg([rank()]))
    d.step()
    d.greet()
    assert d.req(req_id).state == "reading"
    d.submit({"op": "abort", "req_id": req_id})
    assert req_id not in d.worker.leases.tracker._engine_of
    assert {"op": "abort", "req_id": req_id} in told
    assert d.backend.released == d.backend.reads


class Follower:
    """Decode rank 1 of 2 on a :class:`FakeBackend`, its answers collected."""

    def __init__(self) -> None:
        self.backend = FakeBackend("decode-r1-ffffff")
        self.worker = DecodeFollower(
            DecodeOptions(
                config=LeaseConfig(3.0), metrics_port=None, block_size=BLOCK, rank=1, tp=2
            ),
            backend=self.backend,  # type: ignore[arg-type]
        )
        self.replies: list[dict[str, Any]] = []
        self.worker.server.reply = (  # type: ignore[method-assign]
            lambda env, msg: self.replies.append(msg)
        )


@pytest.fixture
def follower() -> Any:
    h = Follower()
    yield h
    h.worker.close()


def test_a_follower_drops_an_aborted_read(follower: Follower) -> None:
    f, backend, replies = follower.worker, follower.backend, follower.replies
    free = backend.num_free
    f._request([b"r0"], {"op": "connect", "ranks": [rank()]})
    f._request(
        [b"r0"],
        {
            "op": "read",
            "req_id": "q1",
            "remote_req_id": "r-q1",
            "num_tokens": 6,
            "ranks": [rank()],
            "verify": [P_AGENT],
        },
    )
    f.step(wait_s=0)
    backend.inbox.append((P_AGENT, wire.encode_ok(wire.CAPABILITY)))
    f.step(wait_s=0)
    assert "q1" in f.reads
    f._request([b"r0"], {"op": "abort", "req_id": "q1"})
    for x in backend.reads:
        x._state = "DONE"
    f.step(wait_s=0)
    assert not f.reads and backend.num_free == free
    assert backend.released == backend.reads
    assert not replies, replies  # unanswered: rank 0 no longer waits for it
    assert f.counts["malformed"] == 0


def test_a_follower_keeps_verifying_an_agent_that_greeted_it(follower: Follower) -> None:
    """A ``read`` without ``verify`` (a forged one on the follower's request
    plane) does not make it use reads of an agent that greeted it unverified."""
    f, backend, replies = follower.worker, follower.backend, follower.replies
    read = {"op": "read", "num_tokens": 6, "ranks": [rank(advert=False)]}
    f._request([b"r0"], {"op": "connect", "ranks": [rank(advert=False)]})
    f._request([b"r0"], {**read, "req_id": "q1", "remote_req_id": "r1", "verify": [P_AGENT]})
    f.step(wait_s=0)
    f.step(wait_s=0)  # the hello goes out
    assert backend.hellos_to(P_AGENT)
    backend.inbox.append((P_AGENT, wire.encode_ok(wire.CAPABILITY)))
    f.step(wait_s=0)
    f._request([b"r0"], {**read, "req_id": "q2", "remote_req_id": "r2"})
    f.step(wait_s=0)
    assert f.reads["q2"].verdicts_due == {P_AGENT}
    for x in backend.reads:
        x._state = "DONE"
    f.step(wait_s=0)
    f.step(wait_s=0)
    assert not [m for m in replies if m["op"] == "read_done"], "used before OK"


def test_a_late_nack_for_a_forgotten_request_is_not_called_wrong(
    d: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    d.backend.connected.add(P_AGENT)
    with caplog.at_level(logging.INFO, logger="leaseproto.decode"):
        for i in range(20):
            d.backend.inbox.append((P_AGENT, wire.encode_nack(f"gone-{i}", "aborted")))
        d.step()
    assert "may be wrong" not in caplog.text
    assert d.worker.stats()["nack_after_answer"] == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "leaseproto.decode"]
    assert 0 < len(lines) <= 2, lines


def test_refused_stops_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    router = Router(
        RouterOptions(prefill=["tcp://127.0.0.1:1"], decode="tcp://127.0.0.1:2", metrics_port=None)
    )
    answers: list[dict[str, Any]] = []
    router.server.reply = lambda env, msg: answers.append(msg)  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(50):
                router.common_op([b"c"], {"op": "stop"})
        assert len(answers) == 50 and all(a["op"] == "error" for a in answers)
        lines = [r.getMessage() for r in caplog.records if r.name == "leaseproto.workers"]
        assert 0 < len(lines) <= 2, lines
        assert not router._stop
    finally:
        router.close()
        router.ctx.term()


def test_failed_requests_are_logged_rate_limited_by_the_router(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client can make every request fail (a prompt D refuses, say): the
    router says so at most once a second, then counts."""
    router = Router(
        RouterOptions(prefill=["tcp://127.0.0.1:1"], decode="tcp://127.0.0.1:2", metrics_port=None)
    )
    router.server.reply = lambda env, msg: None  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="leaseproto.router"):
            for i in range(50):
                p = _Pending([b"c"], i, f"r{i}", [1], 1, 0.0)
                router.pending[p.req_id] = p
                router._finish(p, 1.0, ok=False, error="refused by D")
        assert not router.pending
        lines = [r.getMessage() for r in caplog.records if r.name == "leaseproto.router"]
        assert 0 < len(lines) <= 2, lines
    finally:
        router.close()
        router.ctx.term()
