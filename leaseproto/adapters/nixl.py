"""One NIXL agent as seen from a single-threaded engine loop.

:class:`NixlEndpoint` wraps a NIXL agent (UCX backend, listener thread on
``port`` for metadata exchange) and turns every transport failure into a
return value the loop can feed to the core. Nothing here raises a transport
error; bad arguments (wrong types, mismatched descriptor lists, use after
:meth:`~NixlEndpoint.close`) raise ``TypeError``/``ValueError``/
:class:`EndpointClosed` because they are caller bugs.

Interface (stable; the workers are built on it)::

    load_nixl() -> ModuleType                       # nixl, else nixl_cu12, else ImportError
    free_port(host="127.0.0.1") -> int              # below the ephemeral range (adapters.ports)
    XferDescs(mem_type: str, descs: tuple[tuple[int, int, int], ...])  # (addr, nbytes, dev)
    NixlEndpoint(name, *, host="127.0.0.1", port, connect_timeout=10.0, connect_retry=0.25,
                 progress_thread=False, accept_pushed=True, repush_idle=None)
      .name, .host, .port, .stats: EndpointStats
      .register(tensors: Sequence[torch.Tensor]) -> None
      .connect(peer, host, port, *, probe=None) -> None  # starts the exchange, never blocks
      .is_connected(peer) -> bool
      .forget(peer) -> None                         # drop its metadata and our record
      .connection_state(peer) -> "unknown"|"connecting"|"connected"|"failed"|"lost"
      .send(peer, payload: bytes) -> bool           # False on any transport failure
      .peer_lost(peer) -> bool
      .take_lost_peers() -> list[tuple[str, str]]   # (peer, reason), each reported once
      .poll() -> list[tuple[str, bytes]]            # (sender agent name, message)
      .wait(timeout, *, until=None) -> bool         # until a notification (or until()) is in
      .read(peer, local: XferDescs, remote: XferDescs, *, notif_msg: bytes) -> Transfer
      .transfer_state(xfer) -> "DONE"|"PROC"|"ERR"
      .release(xfer) -> None
      .close() -> None

How NIXL behaves on this path (metadata exchange, silent failed fetches, stale
metadata, disconnects, busy ports, logging) is written down in
:mod:`leaseproto.adapters.nixl_runtime`, beside the helpers that load it.

Progress. NIXL's Python agent starts UCX's progress thread by default with a
zero delay: it spins, 0.4-0.8 of a core per idle agent (``bench_nixl_floor.py``
measures it), and on a machine with fewer cores than busy threads it
is the spinning thread, not the network, that sets the latency of a
notification. The endpoint therefore runs without it (``progress_thread=False``)
and drives UCX from the engine loop instead: :meth:`~NixlEndpoint.poll`,
:meth:`~NixlEndpoint.send` and ``transfer_state`` each progress the worker,
and notifications a ``send`` progressed in are kept, in order, for the next
``poll``. A disconnect is thereby still noticed by the ``send`` after the one
that hit a dead peer. The engine loop must poll: a READ from our memory
progresses on our side only when the loop turns (our workers poll every step
and every few milliseconds when idle).

Names bound to addresses. NIXL loads whatever metadata reaches its
listener, under the name the sender chose, and refuses a later load under a
name already taken (``NIXL_ERR_NOT_ALLOWED``, only logged): a third agent
that pushes metadata under P's agent name before D fetches P's would get
D's notifications. An endpoint made with ``accept_pushed=False`` (our
decode ranks: they only ever talk to agents they fetched from) therefore
removes metadata pushed under a name it never connected to (counted
``pushes_refused``; :meth:`~NixlEndpoint.connection_state` reads
``"unknown"``), also at :meth:`~NixlEndpoint.connect` before it fetches; and
a ``probe`` given to ``connect`` (descriptors of memory the peer said it
serves, from the transfer parameters) makes the peer ``"connected"`` only
once the metadata loaded under its name covers them: other metadata under
that name is removed and fetched again from the address (counted
``names_refetched``) until ``connect_timeout``, then the peer is
``"failed"``. Nothing is sent to a peer before it is ``"connected"``.

Waiting. NIXL offers nothing to block on: no file descriptor, no callback
(the Python agent exposes neither the UCX worker's event fd nor a way to arm
it), and its progress thread, the one thing that does block on that fd, is
started with a zero delay that the Python API does not let us change, so it
spins. :meth:`~NixlEndpoint.wait` is therefore a poll-and-sleep: it progresses
UCX, and sleeps between checks for an interval that starts at
:data:`WAIT_MIN_S` right after traffic (a send or a receive) and grows with the
quiet (:data:`WAIT_GROWTH` of the time since) up to :data:`WAIT_MAX_S`. Linux lets a
sleep overrun by the thread's timer slack, 50 µs by default, more than a loopback
round trip: the first ``wait`` sets the calling thread's slack to
:data:`TIMER_SLACK_NS` (``prctl(PR_SET_TIMERSLACK)``; a per-thread setting that
only makes that thread's timed waits end closer to when they were asked to; a
no-op elsewhere). A sleeping loop is
what the scheduler wakes first: on a machine whose cores are busy, a process
that spins on ``poll`` competes with every busy process for its time slice,
and both sides of a round trip then wait out slices of milliseconds
(``bench_nixl_floor.py --load N`` measures both). The checks cost CPU only
around traffic; a quiet endpoint checks once per :data:`WAIT_MAX_S`.

A peer may forget us (P forgets decoders that fell silent, removing their
metadata) and nothing tells us: our sends still succeed, and it drops them
as a stranger's. With ``repush_idle`` set, a send or READ to a peer we
connected to that follows at least ``repush_idle`` seconds without one
pushes our metadata to it again first (counted ``repushes``): a peer that
forgot us knows us again before the notification arrives (P holds a
notification from a sender whose metadata is on its way for a second).

Not thread-safe: call it from the engine loop only (NIXL's own listener
thread, and the progress thread when asked for, are internal to the agent).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .nixl_peers import EndpointPeers, PeerRecord
from .nixl_reads import EndpointReads
from .nixl_runtime import (
    INSTALL_HINT,
    ConnState,
    EndpointClosed,
    EndpointStats,
    check_port,
    describe,
    free_port,
    load_nixl,
)
from .xfer import Transfer, XferDescs, XferState

if TYPE_CHECKING:
    import torch

__all__ = [
    "INSTALL_HINT",
    "TIMER_SLACK_NS",
    "WAIT_MAX_S",
    "WAIT_MIN_S",
    "ConnState",
    "EndpointClosed",
    "EndpointStats",
    "NixlEndpoint",
    "Transfer",
    "XferDescs",
    "XferState",
    "fine_timer_slack",
    "free_port",
    "load_nixl",
]


#: Shortest sleep between two checks of :meth:`NixlEndpoint.wait`, right after traffic.
WAIT_MIN_S = 5e-6
#: Longest sleep between two checks (once quiet for ``WAIT_MAX_S / WAIT_GROWTH``: 16 ms).
WAIT_MAX_S = 1e-3
#: The sleep between two checks is this fraction of the time since the last traffic.
WAIT_GROWTH = 1 / 16
#: The timer slack :meth:`NixlEndpoint.wait` asks for its thread, nanoseconds.
TIMER_SLACK_NS = 1000
_PR_SET_TIMERSLACK = 29


def fine_timer_slack() -> bool:
    """Set the calling thread's timer slack to :data:`TIMER_SLACK_NS` (Linux);
    False where that cannot be done (and nothing changed)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class NixlEndpoint(EndpointPeers, EndpointReads):
    """A NIXL agent named ``name`` with its metadata listener on ``host:port``
    (``host`` is where peers reach us; the listener binds every interface)."""

    def __init__(
        self,
        name: str,
        *,
        host: str = "127.0.0.1",
        port: int,
        connect_timeout: float = 10.0,
        connect_retry: float = 0.25,
        progress_thread: bool = False,
        accept_pushed: bool = True,
        repush_idle: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("endpoint name must be a non-empty str")
        check_port(port)
        if connect_timeout <= 0 or connect_retry <= 0:
            raise ValueError("connect_timeout and connect_retry must be > 0")
        nixl = load_nixl()
        config = nixl.nixl_agent_config(
            enable_prog_thread=bool(progress_thread),
            enable_listen_thread=True,
            listen_port=port,
            backends=["UCX"],
        )
        try:
            agent = nixl.nixl_agent(name, config)
        except RuntimeError as exc:
            if "bind" not in str(exc).lower():
                raise
            raise OSError(
                f"cannot listen for NIXL metadata on port {port}: {exc} (port in use? "
                "--nixl-port 0 picks a free port)"
            ) from exc
        if "UCX" not in agent.backends:
            raise RuntimeError("NIXL has no UCX backend: the transport cannot start")
        self._agent: Any = agent
        self.name = name
        self.host = host
        self.port = port
        self.connect_timeout = float(connect_timeout)
        self.connect_retry = float(connect_retry)
        self.stats = EndpointStats()
        self._peers: dict[str, PeerRecord] = {}
        self._lost: list[tuple[str, str]] = []
        self._registered: list[Any] = []
        self.progress_thread = bool(progress_thread)
        #: whether metadata a peer pushed without our connect() makes it a peer
        self.accept_pushed = bool(accept_pushed)
        if repush_idle is not None and not repush_idle > 0:
            raise ValueError("repush_idle must be > 0 (or None)")
        self.repush_idle = repush_idle
        #: notifications a send() or wait() progressed in, for the next poll()
        self._early: list[tuple[str, bytes]] = []
        #: when we last sent or received a notification (wait()'s check interval)
        self._traffic_at = -1e9
        #: the thread whose timer slack wait() set (None: not yet)
        self._slack_thread: int | None = None

    # -- memory ---------------------------------------------------------------

    def register(self, tensors: Sequence[torch.Tensor]) -> None:
        """Register contiguous tensors (CPU → DRAM, CUDA → VRAM) with UCX so
        peers can READ them. Do it before connecting (see the module notes)."""
        agent = self._live()
        for tensor in tensors:
            if not tensor.is_contiguous():
                raise ValueError("only contiguous tensors can be registered")
            self._registered.append(agent.register_memory(tensor))
        for peer, rec in self._peers.items():
            if rec.state in ("connecting", "connected"):
                self._push_metadata(peer, rec)

    # -- connections ----------------------------------------------------------

    def connect(self, peer: str, host: str, port: int, *, probe: XferDescs | None = None) -> None:
        """Start exchanging metadata with ``peer`` (its agent name) listening
        on ``host:port``; returns at once. Poll :meth:`is_connected`. Calling
        it for a connected peer at the same address does nothing; for a lost
        or failed one (or a new address) it starts over. ``probe``: memory the
        peer serves; the peer is connected only once its metadata covers it
        (see the module notes)."""
        agent = self._live()
        if not isinstance(peer, str) or not peer or peer == self.name:
            raise ValueError(f"bad peer name {peer!r}")
        check_port(port)
        rec = self._peers.get(peer)
        if (
            rec is not None
            and rec.state in ("connecting", "connected")
            and (rec.host, rec.port) == (host, port)
        ):
            return
        if rec is not None and agent.check_remote_metadata(peer):
            # lost, failed or moved: drop what we hold (and its UCX endpoints).
            self._remove(peer)
        elif rec is None and not self.accept_pushed and agent.check_remote_metadata(peer):
            # pushed under this name by someone we never fetched from: it would
            # take the name from the real peer (NIXL refuses a second load)
            self.stats.pushes_refused += 1
            self._remove(peer)
        # (with accept_pushed, metadata a peer pushed to us without our
        # connect() is kept: the peer may be reading from us right now)
        now = time.monotonic()
        rec = PeerRecord(
            host=host,
            port=port,
            state="connecting",
            started=now,
            last_try=now,
            delay=self.connect_retry,
            probe=probe,
            last_sent=now,
        )
        self._peers[peer] = rec
        self.stats.connects += 1
        self._fetch(peer, rec)

    def forget(self, peer: str) -> None:
        """Drop ``peer``: its metadata (and UCX endpoints) and our record of it.
        It becomes ``"unknown"``; a peer that comes back must connect again."""
        agent = self._live()
        self._peers.pop(peer, None)
        if agent.check_remote_metadata(peer):
            self._remove(peer)
        self.stats.forgotten += 1

    def connection_state(self, peer: str) -> ConnState:
        """Where ``peer`` stands. A peer that connected to *us* (we hold its
        metadata without calling :meth:`connect`) reads ``"connected"``."""
        agent = self._live()
        rec = self._peers.get(peer)
        if rec is None:
            if not agent.check_remote_metadata(peer):
                return "unknown"
            if self.accept_pushed:
                return "connected"
            self.stats.pushes_refused += 1  # pushed under a name we never fetched
            self._remove(peer)
            return "unknown"
        self._progress(peer, rec, time.monotonic())
        return rec.state

    def is_connected(self, peer: str) -> bool:
        return self.connection_state(peer) == "connected"

    def peer_lost(self, peer: str) -> bool:
        """True when ``peer`` disconnected or its connect timed out."""
        rec = self._peers.get(peer)
        return rec is not None and rec.state in ("lost", "failed")

    def take_lost_peers(self) -> list[tuple[str, str]]:
        """Peers lost since the last call, as ``(peer, reason)``, each once."""
        self._progress_all()
        out, self._lost = self._lost, []
        return out

    # -- notifications --------------------------------------------------------

    def send(self, peer: str, payload: bytes) -> bool:
        """Send one notification. Returns False (counted in ``send_failed``)
        when it could not be sent: peer lost, not connected yet, or any NIXL
        error; a disconnect also marks the peer lost."""
        agent = self._live()
        if not isinstance(payload, (bytes, bytearray)):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        rec = self._peers.get(peer)
        if rec is not None:
            self._progress(peer, rec, time.monotonic())
            if rec.state != "connected":
                self.stats.send_failed += 1
                return False
            self._repush_if_idle(peer)
        if not self.progress_thread:
            self._early.extend(self._drain())  # lets UCX notice a dead peer first
        try:
            agent.send_notif(peer, bytes(payload))
        except Exception as exc:
            self._failed(peer, exc)
            self.stats.send_failed += 1
            return False
        self.stats.sent += 1
        self._traffic_at = time.monotonic()
        if not self.progress_thread:
            self._early.extend(self._drain())  # moves the message on its way
        return True

    def poll(self) -> list[tuple[str, bytes]]:
        """Every notification received since the last poll, as
        ``(sender agent name, message)``; order is kept per sender. Also
        advances pending connects (retries, timeouts)."""
        self._live()
        self._progress_all()
        out, self._early = self._early, []
        out += self._drain()
        if out:
            self.stats.received += len(out)
            self._traffic_at = time.monotonic()
        return out

    def wait(self, timeout: float, *, until: Callable[[], bool] | None = None) -> bool:
        """Wait up to ``timeout`` seconds for a notification (kept, in order, for
        the next :meth:`poll`) or for ``until()`` to return true (the caller's
        other input, e.g. a socket with a message waiting); True when either came,
        False at the timeout. Progresses UCX at each check (a READ we initiated
        moves on too), sleeping in between; see "Waiting" in the module notes."""
        self._live()
        if self._slack_thread != threading.get_ident():
            fine_timer_slack()
            self._slack_thread = threading.get_ident()
        start = now = time.monotonic()
        end = start + timeout
        while True:
            if self._early or (until is not None and until()):
                return True
            got = self._drain()
            if got:
                self._early.extend(got)
                self._traffic_at = now
                return True
            if now >= end:
                return False
            quiet = now - self._traffic_at
            time.sleep(min(max(quiet * WAIT_GROWTH, WAIT_MIN_S), WAIT_MAX_S, end - now))
            now = time.monotonic()

    def _drain(self) -> list[tuple[str, bytes]]:
        """What NIXL received since it was last asked (progressing UCX)."""
        try:
            notifs = self._agent.get_new_notifs()
        except Exception as exc:
            self.stats.poll_failed += 1
            self.stats.last_error = describe(exc)
            return []
        return [(str(peer), bytes(msg)) for peer, msgs in notifs.items() for msg in msgs]

    def close(self) -> None:
        """Deregister memory and drop the agent (its threads stop with it)."""
        agent = self._agent
        if agent is None:
            return
        for reg in self._registered:
            try:
                agent.deregister_memory(reg)
            except Exception as exc:
                self.stats.last_error = describe(exc)
        self._registered.clear()
        self._agent = None

    # -- internals ------------------------------------------------------------

    def _live(self) -> Any:
        if self._agent is None:
            raise EndpointClosed(f"endpoint {self.name!r} is closed")
        return self._agent
