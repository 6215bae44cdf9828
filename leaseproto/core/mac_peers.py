"""Who holds the cluster key: the connections of one NIXL agent to its peers
(spec §3.6, §10.3), built on the frames of :mod:`.mac`.

:class:`PeerAuth` is the whole of it for a worker or the vLLM connector:
:meth:`PeerAuth.seal` turns an outgoing payload into what goes on the wire and
:meth:`PeerAuth.open` an incoming one into the payload the protocol handles,
or a :class:`Refused` naming why it is dropped. It owns no clock and does no
I/O; nonces come from ``nonces`` (``secrets.token_bytes`` by default).

A connection starts with D's greeting (``HB:leaseproto/1``, or the vLLM
connector's hello) sealed under a fresh ``nonce_d``; P verifies it, picks a
fresh ``nonce_p`` for it (the same one again for a resent greeting) and seals
its answer (``OK:leaseproto/1``) under both. D takes the first answer naming
its current ``nonce_d``: from then on every frame either way carries both
nonces and a sequence number. P sends on the connection D last used, so a
replayed greeting (it verifies: D sealed it) costs P a connection record and
D a dropped answer, nothing more.

Only a peer we greeted, or one that greeted us, gets frames; :meth:`seal`
returns every other payload unchanged (a stock vLLM peer, which never
greets, never receives a frame). A keyed receiver drops every payload that is
not a frame it can verify: it never acts on a stranger's message.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from . import wire
from .mac import (
    KIND_ANSWER,
    KIND_GREETING,
    KIND_MESSAGE,
    NONCE_BYTES,
    ClusterKey,
    Frame,
    MalformedFrame,
    ReplayWindow,
    Sealer,
    is_frame,
    unpack,
)

__all__ = ["ANSWER", "GREETING", "PeerAuth", "Refused", "is_greeting"]

#: D's greeting in our workers (a heartbeat naming the capability token).
GREETING = wire.HEARTBEAT_PREFIX + wire.CAPABILITY.encode()
#: P's answer to it.
ANSWER = wire.OK_PREFIX + wire.CAPABILITY.encode()
#: The vLLM connector's greeting: ``leaseproto/1,hello,`` and D's agent metadata.
_HELLO_PREFIX = (wire.CAPABILITY + ",hello,").encode()
#: Connections kept per peer that greeted us (the one in use always stays).
_MAX_CONNS = 4
#: Why a payload is dropped, in the order :attr:`PeerAuth.dropped` lists them.
REASONS = ("unauthenticated", "malformed frame", "bad mac", "unknown connection", "replayed")


def is_greeting(payload: bytes) -> bool:
    """Whether ``payload`` opens a connection (our greeting or vLLM's hello)."""
    return payload == GREETING or payload.startswith(_HELLO_PREFIX)


@dataclass(frozen=True)
class Refused:
    """An incoming payload that is dropped, and why (one of :data:`REASONS`)."""

    reason: str
    detail: str


@dataclass
class _Conn:
    """One connection as one side sees it."""

    nonce_d: bytes
    nonce_p: bytes
    out: Sealer
    into: Sealer
    #: P's answer: sealed by P (``out`` side), checked by D (``into`` side)
    answer: Sealer
    window: ReplayWindow = field(default_factory=ReplayWindow)
    next_seq: int = 0
    #: when it was opened, in connections of that peer (P sends on the newest in use)
    born: int = 0

    def seal(self, sealer: Sealer, payload: bytes) -> bytes:
        seq = self.next_seq
        self.next_seq += 1
        return sealer.seal(seq, payload)


def _conn(key: bytes, me: str, peer: str, nd: bytes, np: bytes, *, initiator: bool) -> _Conn:
    d, p = (me, peer) if initiator else (peer, me)
    return _Conn(
        nd,
        np,
        out=Sealer(key, KIND_MESSAGE, me, peer, nd, np),
        into=Sealer(key, KIND_MESSAGE, peer, me, nd, np),
        answer=Sealer(key, KIND_ANSWER, p, d, nd, np),
    )


@dataclass
class _Greeted:
    """A peer we greeted (we are D to it)."""

    nonce_d: bytes
    greeting: Sealer
    greetings_sent: int = 0
    conn: _Conn | None = None


@dataclass
class _Greeter:
    """A peer that greeted us (we are P to it)."""

    conns: dict[bytes, _Conn] = field(default_factory=dict)  # by nonce_d, oldest first
    current: _Conn | None = None  # the newest one the peer sent a message on
    answering: _Conn | None = None  # the one its latest greeting opened
    opened: int = 0


class PeerAuth:
    """The connections of agent ``agent`` under one cluster key."""

    def __init__(
        self,
        key: ClusterKey,
        agent: str,
        *,
        nonces: Callable[[], bytes] = lambda: secrets.token_bytes(NONCE_BYTES),
    ) -> None:
        self.key = key
        self.agent = agent
        self._nonces = nonces
        self._greeted: dict[str, _Greeted] = {}
        self._greeters: dict[str, _Greeter] = {}
        #: payloads dropped, by reason (:data:`REASONS`)
        self.dropped: dict[str, int] = dict.fromkeys(REASONS, 0)
        #: payloads that could not be sealed (no connection to that peer yet)
        self.unsealed = 0

    # -- peers ----------------------------------------------------------------------------
    def expect(self, peer: str) -> None:
        """``peer`` holds the key (it advertised it): what we send it is
        sealed, and nothing but a greeting goes until it answered one."""
        if peer not in self._greeted:
            nd = self._nonce()
            self._greeted[peer] = _Greeted(
                nd, Sealer(self.key.mac_key, KIND_GREETING, self.agent, peer, nd)
            )

    def ready(self, peer: str) -> bool:
        """Whether a message to ``peer`` can go now (a greeted peer answered)."""
        g = self._greeted.get(peer)
        return g is None or g.conn is not None

    def forget(self, peer: str) -> None:
        """Drop every connection with ``peer`` (it left)."""
        self._greeted.pop(peer, None)
        self._greeters.pop(peer, None)

    def _nonce(self) -> bytes:
        nonce = self._nonces()
        if len(nonce) != NONCE_BYTES or not any(nonce):
            raise ValueError(f"a nonce is {NONCE_BYTES} bytes, not all zero")
        return nonce

    # -- sending --------------------------------------------------------------------------
    def seal(self, peer: str, payload: bytes) -> bytes | None:
        """What to send ``peer`` for ``payload``: a frame, the payload itself
        (a peer that never greeted and that we never greeted), or None (a
        greeted peer has not answered yet; counted in :attr:`unsealed`)."""
        g = self._greeted.get(peer)
        if is_greeting(payload):
            if g is None:
                self.expect(peer)
                g = self._greeted[peer]
            g.greetings_sent += 1
            return g.greeting.seal(g.greetings_sent - 1, payload)
        r = self._greeters.get(peer)
        if r is not None and payload == ANSWER and r.answering is not None:
            return r.answering.seal(r.answering.answer, payload)
        conn = g.conn if g is not None else None if r is None else r.current
        if conn is None:
            if g is None and r is None:
                return payload
            self.unsealed += 1
            return None
        return conn.seal(conn.out, payload)

    # -- receiving ------------------------------------------------------------------------
    def open(self, peer: str, data: bytes) -> bytes | Refused:
        """The payload ``data`` from ``peer`` carries, or why it is dropped."""
        if not is_frame(data):
            return self._refuse("unauthenticated", f"{len(data)} unsealed bytes from {peer}")
        try:
            frame = unpack(data)
        except MalformedFrame as exc:
            return self._refuse("malformed frame", f"from {peer}: {exc}")
        if frame.kind == KIND_GREETING:
            return self._greeting(peer, frame)
        if frame.kind == KIND_ANSWER:
            return self._answer(peer, frame)
        return self._message(peer, frame)

    def _refuse(self, reason: str, detail: str) -> Refused:
        self.dropped[reason] += 1
        return Refused(reason, detail)

    def _greeting(self, peer: str, frame: Frame) -> bytes | Refused:
        sealer = Sealer(self.key.mac_key, KIND_GREETING, peer, self.agent, frame.nonce_d)
        if not sealer.verify(frame) or not is_greeting(frame.payload):
            return self._refuse("bad mac", f"greeting from {peer}")
        r = self._greeters.setdefault(peer, _Greeter())
        conn = r.conns.get(frame.nonce_d)
        if conn is None:
            conn = _conn(
                self.key.mac_key, self.agent, peer, frame.nonce_d, self._nonce(), initiator=False
            )
            r.opened += 1
            conn.born = r.opened
            r.conns[frame.nonce_d] = conn
            for nd in list(r.conns):
                if len(r.conns) <= _MAX_CONNS:
                    break
                if r.conns[nd] is not r.current and r.conns[nd] is not conn:
                    del r.conns[nd]
        r.answering = conn
        return frame.payload

    def _answer(self, peer: str, frame: Frame) -> bytes | Refused:
        g = self._greeted.get(peer)
        if g is None or frame.nonce_d != g.nonce_d:
            return self._refuse("unknown connection", f"answer from {peer}")
        conn = g.conn
        if conn is None:
            conn = _conn(
                self.key.mac_key, self.agent, peer, g.nonce_d, frame.nonce_p, initiator=True
            )
        elif frame.nonce_p != conn.nonce_p:
            return self._refuse("unknown connection", f"answer from {peer}")
        if not conn.answer.verify(frame) or frame.payload != ANSWER:
            return self._refuse("bad mac", f"answer from {peer}")
        refused = self._admit(conn, peer, frame)
        if refused is None:
            g.conn = conn
        return frame.payload if refused is None else refused

    def _message(self, peer: str, frame: Frame) -> bytes | Refused:
        g = self._greeted.get(peer)
        r = self._greeters.get(peer)
        conn: _Conn | None = None
        if g is not None and g.conn is not None and g.nonce_d == frame.nonce_d:
            conn = g.conn
        elif r is not None:
            conn = r.conns.get(frame.nonce_d)
        if conn is None or conn.nonce_p != frame.nonce_p:
            return self._refuse("unknown connection", f"message from {peer}")
        if not conn.into.verify(frame):
            return self._refuse("bad mac", f"message from {peer}")
        refused = self._admit(conn, peer, frame)
        if refused is not None:
            return refused
        newer = r is not None and (r.current is None or conn.born > r.current.born)
        if r is not None and newer and conn is r.conns.get(frame.nonce_d):
            r.current = conn
        return frame.payload

    def _admit(self, conn: _Conn, peer: str, frame: Frame) -> Refused | None:
        """Refused when the window already saw (or has moved past) ``frame``'s
        sequence number; else the number is marked seen."""
        why = conn.window.check(frame.seq)
        if why is not None:
            return self._refuse("replayed", f"frame {frame.seq} from {peer} ({why})")
        conn.window.accept(frame.seq)
        return None

    @property
    def strangers(self) -> int:
        """Payloads dropped because no key holder sealed them for us."""
        return sum(self.dropped[r] for r in ("unauthenticated", "malformed frame", "bad mac"))
