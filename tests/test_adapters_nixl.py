"""NixlEndpoint over real NIXL (UCX, CPU memory) between processes on loopback.

One spawned peer process hosts three agents: ``Bf`` (a pool with every head)
and ``B0``/``B1`` (TP shards: heads 0-1 and 2-3). Their pools hold a known
pattern, so this process can check what its READs brought back without the
data travelling any other way. Every wait polls against a deadline.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import polling
import pytest
import torch

from leaseproto.adapters import nixl as nixl_module
from leaseproto.adapters.kv_pool import KVPool, PoolLayout, read_plan
from leaseproto.adapters.nixl import WAIT_MAX_S, WAIT_MIN_S, NixlEndpoint, free_port, load_nixl
from leaseproto.adapters.xfer import XferDescs

try:
    load_nixl()
except ImportError as exc:  # pragma: no cover - CI installs NIXL
    pytest.skip(f"NIXL is not importable: {exc}", allow_module_level=True)

pytestmark = pytest.mark.e2e

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 2, 8, 4, 4, 8
# the peer's agents: name -> (head_start, num_heads, pattern offset)
PEERS = {"Bf": (0, 4, 100_000), "B0": (0, 2, 0), "B1": (2, 2, 0)}
SPAWN_S = 120.0  # spawning a process that imports torch and NIXL, on a loaded machine
WAIT_S = 30.0


def pattern(head_start: int, num_heads: int, offset: int) -> torch.Tensor:
    """Every element numbered by its global position (exact in float32), so
    the two shards together equal the full pool (offset aside)."""
    n = LAYERS * 2 * BLOCKS * HEADS * BLOCK_SIZE * HEAD_DIM
    full = torch.arange(n, dtype=torch.float32).view(LAYERS, 2, BLOCKS, HEADS, BLOCK_SIZE, HEAD_DIM)
    return full[:, :, :, head_start : head_start + num_heads].contiguous() + offset


def make_pool(head_start: int = 0, num_heads: int = HEADS) -> KVPool:
    return KVPool(
        num_layers=LAYERS,
        num_blocks=BLOCKS,
        block_size=BLOCK_SIZE,
        num_heads=num_heads,
        head_dim=HEAD_DIM,
        head_start=head_start,
        total_heads=HEADS,
        device="cpu",
    )


def wait_for(pred: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    return polling.wait_for(pred, what, timeout, every=0.002)


# -- the peer process ------------------------------------------------------------------


def _peer_main(ports: dict[str, int], cmds: Any, results: Any) -> None:
    eps: dict[str, NixlEndpoint] = {}
    keep: list[torch.Tensor] = []
    inbox: dict[str, list[tuple[str, bytes]]] = {name: [] for name in ports}
    layouts = {}
    for name, port in ports.items():
        ep = NixlEndpoint(name, port=port)
        h0, nh, offset = PEERS[name]
        pool = make_pool(h0, nh)
        pool.tensors()[0].copy_(pattern(h0, nh, offset))
        pool.allocate(BLOCKS)
        pool.register_with(ep)
        keep.extend(pool.tensors())
        eps[name], layouts[name] = ep, pool.layout()
    results.put(("ready", layouts))
    while True:
        for name, ep in eps.items():
            for sender, msg in ep.poll():
                if msg.startswith(b"ECHO:"):
                    ep.send(sender, b"BACK:" + msg[5:])
                else:
                    inbox[name].append((sender, msg))
        try:
            cmd, *args = cmds.get(timeout=0.002)
        except queue.Empty:
            continue
        if cmd == "exit":
            return
        if cmd == "inbox":
            results.put(("inbox", inbox[args[0]]))
            inbox[args[0]] = []
        elif cmd == "state":
            results.put(("state", eps[args[0]].connection_state(args[1])))
        elif cmd == "register_extra":  # memory registered after peers connected
            extra = torch.full((HEADS * BLOCK_SIZE * HEAD_DIM,), 7.0)  # one K block's size
            eps[args[0]].register([extra])
            keep.append(extra)
            results.put(("register_extra", (extra.data_ptr(), extra.numel() * 4)))


class Peer:
    """The peer process; :meth:`ready` waits for its agents to be up."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.ports = {name: free_port() for name in PEERS}
        self.cmds, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(
            target=_peer_main, args=(self.ports, self.cmds, self.results), daemon=True
        )
        self.proc.start()
        self.layouts: dict[str, dict[str, Any]] = {}

    def ready(self) -> Peer:
        if not self.layouts:
            self.layouts = self.ask(None, timeout=SPAWN_S)
        return self

    def ask(self, cmd: tuple[Any, ...] | None, timeout: float = WAIT_S) -> Any:
        if cmd is not None:
            self.cmds.put(cmd)
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, value = self.results.get(timeout=0.5)
                return value
            except queue.Empty:
                if not self.proc.is_alive():
                    raise AssertionError(f"peer exited ({self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise AssertionError(f"peer gave no answer to {cmd} in {timeout:g} s") from None

    def inbox_until(self, name: str, count: int) -> list[tuple[str, bytes]]:
        got: list[tuple[str, bytes]] = []

        def more() -> bool:
            got.extend(self.ask(("inbox", name)))
            return len(got) >= count

        wait_for(more, f"{count} notification(s) at {name}")
        return got


class LonePeer:
    """A process with one agent ``C``, to be killed."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.port = free_port()
        self.up = ctx.Queue()
        self.proc = ctx.Process(target=_lone_peer, args=(self.port, self.up), daemon=True)
        self.proc.start()


@pytest.fixture(scope="module")
def processes() -> Iterator[tuple[Peer, LonePeer]]:
    """Both peer processes, started together (spawning dominates the runtime)."""
    peer, lone = Peer(), LonePeer()
    yield peer, lone
    peer.cmds.put(("exit",))
    peer.proc.join(10)
    for proc in (peer.proc, lone.proc):
        if proc.is_alive():
            proc.kill()
            proc.join(10)


@pytest.fixture(scope="module")
def peer(processes: tuple[Peer, LonePeer]) -> Peer:
    return processes[0].ready()


@pytest.fixture
def lone(processes: tuple[Peer, LonePeer]) -> LonePeer:
    return processes[1]


@pytest.fixture(scope="module")
def a(peer: Peer) -> Iterator[tuple[NixlEndpoint, KVPool]]:
    ep = NixlEndpoint(f"A{os.getpid()}", port=free_port())
    pool = make_pool()
    pool.register_with(ep)
    for name, port in peer.ports.items():
        ep.connect(name, "127.0.0.1", port)
    for name in peer.ports:
        wait_for(lambda n=name: ep.is_connected(n), f"metadata of {name}")  # type: ignore[misc]
    # and each peer agent has loaded ours (pushed by connect(), loaded by its listener
    # thread): a peer that answers before then fails its send ("genNotif: no specified or
    # potential backend could send the inter-agent notifications"), which lost B0's echo
    # in one clean-clone CI run
    for name in peer.ports:
        wait_for(
            lambda n=name: peer.ask(("state", n, ep.name)) == "connected",  # type: ignore[misc]
            f"{name} to know {ep.name}",
        )
    yield ep, pool
    ep.close()


def read_and_wait(
    ep: NixlEndpoint, peer_name: str, local: XferDescs, remote: XferDescs, notif: bytes
) -> None:
    xfer = ep.read(peer_name, local, remote, notif_msg=notif)
    state = wait_for(
        lambda: ep.transfer_state(xfer) != "PROC" and xfer.state, f"READ from {peer_name}"
    )
    assert state == "DONE", xfer.error
    ep.release(xfer)


# -- tests -----------------------------------------------------------------------------------


def test_metadata_exchange_is_two_way(peer: Peer, a: tuple[NixlEndpoint, KVPool]) -> None:
    ep, _ = a
    assert ep.connection_state("Bf") == "connected"
    # connect() pushed our metadata, so the peer can reach us without connecting
    wait_for(lambda: peer.ask(("state", "Bf", ep.name)) == "connected", "peer to know us")
    assert ep.connection_state("nobody") == "unknown"


def test_notification_round_trip(peer: Peer, a: tuple[NixlEndpoint, KVPool]) -> None:
    ep, _ = a
    big = bytes(range(256)) * 4096  # 1 MiB
    sent_before = ep.stats.sent
    for payload in (b"HB:req-1,req-2", big):
        assert ep.send("B0", b"ECHO:" + payload)
        got = wait_for(ep.poll, "the echo")
        assert got == [("B0", b"BACK:" + payload)]
    assert ep.send("B1", b"HB:x")
    assert peer.inbox_until("B1", 1) == [(ep.name, b"HB:x")]
    assert ep.stats.sent == sent_before + 3
    assert ep.stats.received >= 2


def test_read_blocks_and_transfer_done_notification(
    peer: Peer, a: tuple[NixlEndpoint, KVPool]
) -> None:
    ep, pool = a
    remote = PoolLayout.from_dict(peer.layouts["Bf"])
    src = [5, 2, 7]
    dst = pool.allocate(3)
    plan = read_plan(pool.pool_layout, remote, dst, src)
    assert plan is not None
    read_and_wait(ep, "Bf", *plan, notif=b"req-7:1")
    want = pattern(0, HEADS, 100_000)
    for layer in range(LAYERS):
        assert torch.equal(pool.k(layer)[dst], want[layer, 0, src])
        assert torch.equal(pool.v(layer)[dst], want[layer, 1, src])
    assert peer.inbox_until("Bf", 1) == [(ep.name, b"req-7:1")]
    pool.free(dst)


def test_head_shard_reads_assemble_a_full_block(peer: Peer, a: tuple[NixlEndpoint, KVPool]) -> None:
    """Two P ranks hold half the heads each; D holds all heads and reads its
    block's two halves from the two ranks, each READ notifying its own rank."""
    ep, pool = a
    src, dst = [1, 6], pool.allocate(2)
    for name in ("B0", "B1"):
        plan = read_plan(pool.pool_layout, PoolLayout.from_dict(peer.layouts[name]), dst, src)
        assert plan is not None
        assert plan[0].nbytes == pool.pool_layout.descs(dst).nbytes // 2
        read_and_wait(ep, name, *plan, notif=f"req-9:{name}".encode())
    want = pattern(0, HEADS, 0)
    for layer in range(LAYERS):
        assert torch.equal(pool.k(layer)[dst], want[layer, 0, src])
        assert torch.equal(pool.v(layer)[dst], want[layer, 1, src])
    for name in ("B0", "B1"):
        assert peer.inbox_until(name, 1) == [(ep.name, f"req-9:{name}".encode())]
    pool.free(dst)


def test_read_waits_for_metadata_of_late_registered_memory(
    peer: Peer, a: tuple[NixlEndpoint, KVPool]
) -> None:
    """Memory the peer registered after we fetched its metadata: the READ
    refreshes the metadata and goes through instead of failing."""
    ep, pool = a
    addr, nbytes = peer.ask(("register_extra", "B0"))
    dst = pool.allocate(1)
    local = XferDescs("DRAM", (pool.descs(dst).descs[0],))  # layer 0, K, our block
    assert local.nbytes == nbytes
    read_and_wait(ep, "B0", local, XferDescs("DRAM", ((addr, nbytes, 0),)), notif=b"x:1")
    assert bool((pool.k(0)[dst[0]] == 7.0).all())
    assert peer.inbox_until("B0", 1) == [(ep.name, b"x:1")]
    pool.free(dst)


def test_read_of_unregistered_memory_ends_in_err(peer: Peer) -> None:
    ep = NixlEndpoint(f"A2{os.getpid()}", port=free_port(), connect_timeout=1.0)
    try:
        local = torch.zeros(16)
        ep.register([local])
        ep.connect("Bf", "127.0.0.1", peer.ports["Bf"])
        wait_for(lambda: ep.is_connected("Bf"), "metadata of Bf")
        bogus = XferDescs("DRAM", ((4096, 64, 0),))  # nothing the peer registered
        xfer = ep.read(
            "Bf", XferDescs("DRAM", ((local.data_ptr(), 64, 0),)), bogus, notif_msg=b"never"
        )
        wait_for(lambda: ep.transfer_state(xfer) == "ERR", "the READ to fail", timeout=20)
        assert "has not registered" in xfer.error
        assert ep.stats.reads_failed == 1
        ep.release(xfer)
        # abandoned while waiting for metadata: never posted, reads ERR
        again = ep.read(
            "Bf", XferDescs("DRAM", ((local.data_ptr(), 64, 0),)), bogus, notif_msg=b"never"
        )
        assert ep.transfer_state(again) == "PROC"
        ep.release(again)
        assert ep.transfer_state(again) == "ERR" and "released" in again.error
    finally:
        ep.close()


def test_connect_to_nobody_times_out_as_lost() -> None:
    ep = NixlEndpoint(f"A3{os.getpid()}", port=free_port(), connect_timeout=0.5, connect_retry=0.1)
    try:
        ep.connect("ghost", "127.0.0.1", free_port())
        assert ep.connection_state("ghost") == "connecting"
        assert not ep.send("ghost", b"HB:x")  # not connected yet: refused, no exception
        lost = wait_for(ep.take_lost_peers, "the connect timeout")
        assert lost[0][0] == "ghost" and "connect timeout" in lost[0][1]
        assert ep.peer_lost("ghost") and ep.connection_state("ghost") == "failed"
        assert ep.take_lost_peers() == []  # reported once
        assert ep.stats.connect_retries >= 1
    finally:
        ep.close()


def _lone_peer(port: int, up: Any) -> None:
    ep = NixlEndpoint("C", port=port)
    ep.register([torch.zeros(64)])
    up.put("up")
    while True:
        ep.poll()
        time.sleep(0.01)


def test_send_to_a_dead_peer_returns_false(lone: LonePeer) -> None:
    ep = NixlEndpoint(f"A4{os.getpid()}", port=free_port())
    try:
        lone.up.get(timeout=SPAWN_S)
        ep.connect("C", "127.0.0.1", lone.port)
        wait_for(lambda: ep.is_connected("C"), "metadata of C")
        assert ep.send("C", b"HB:alive")
        lone.proc.kill()
        lone.proc.join(WAIT_S)
        # UCX notices the dead process on the next send (at once on loopback)
        wait_for(lambda: not ep.send("C", b"HB:x") and ep.peer_lost("C"), "the disconnect")
        assert ep.take_lost_peers() == [("C", "disconnected")]
        assert ep.connection_state("C") == "lost"
        assert not ep.send("C", b"HB:y")
        assert ep.stats.send_failed >= 2 and ep.stats.peers_lost == 1
        local = torch.zeros(8)
        ep.register([local])
        xfer = ep.read(
            "C",
            XferDescs("DRAM", ((local.data_ptr(), 32, 0),)),
            XferDescs("DRAM", ((4096, 32, 0),)),
            notif_msg=b"r:1",
        )
        assert ep.transfer_state(xfer) == "ERR" and "lost" in xfer.error
    finally:
        ep.close()


# -- waiting (NixlEndpoint.wait: a poll-and-sleep) --------------------------------------------


def test_wait_ends_with_a_notification_and_keeps_it_for_poll(
    peer: Peer, a: tuple[NixlEndpoint, KVPool]
) -> None:
    ep, _ = a
    wait_for(lambda: not ep.poll(), "nothing left over")
    for k in range(3):
        assert ep.send("B0", b"ECHO:w%d" % k)
        assert ep.wait(WAIT_S)  # the echo, not the timeout
        got = ep.poll()
        while not got:  # (an echo can race the wait's last check: it is the next poll's)
            got = ep.poll()
        assert got == [("B0", b"BACK:w%d" % k)]


def test_wait_times_out_or_ends_when_until_says(a: tuple[NixlEndpoint, KVPool]) -> None:
    ep, _ = a
    t0 = time.monotonic()
    assert not ep.wait(0.05)
    assert time.monotonic() - t0 >= 0.05
    asked: list[int] = []

    def third() -> bool:
        asked.append(1)
        return len(asked) == 3

    assert ep.wait(WAIT_S, until=third)
    assert len(asked) == 3


class _Clock:
    """``time`` for nixl.py: a monotonic clock that only sleeping moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_wait_checks_often_after_traffic_and_seldom_when_quiet(
    peer: Peer, a: tuple[NixlEndpoint, KVPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What keeps an idle worker's CPU down: a quiet endpoint checks once per WAIT_MAX_S,
    # while right after traffic (where a reply is due) it checks every WAIT_MIN_S or so
    ep, _ = a
    clock = _Clock()
    monkeypatch.setattr(nixl_module, "time", clock)
    assert ep.send("B1", b"HB:quiet")  # B1 keeps what is not an ECHO: nothing comes back
    assert not ep.wait(0.1)
    after = clock.slept
    assert after[0] == WAIT_MIN_S
    assert after[:-1] == sorted(after[:-1])  # longer as the quiet goes on (the last: what is left)
    assert max(after) == WAIT_MAX_S  # ... up to the longest
    clock.slept = []
    assert not ep.wait(0.1)  # quiet for 0.1 s already: every pause is the longest
    quiet = clock.slept
    assert all(p == WAIT_MAX_S for p in quiet[:-1]) and len(quiet) <= 0.1 / WAIT_MAX_S + 1
    first_10ms = sum(1 for elapsed in itertools.accumulate(after) if elapsed < 0.01)
    assert first_10ms >= 5 * 0.01 / WAIT_MAX_S  # the first 10 ms after traffic: 5x the checks
    monkeypatch.undo()
    assert peer.inbox_until("B1", 1) == [(ep.name, b"HB:quiet")]
