"""The cluster key of a deployment (``--cluster-key-file``; spec §10.3): read
once at start-up, then used twice.

- **NIXL notifications**: :class:`~leaseproto.core.mac_peers.PeerAuth` seals
  leaseproto's own messages between two peers that greeted with the key
  (:mod:`.backend` wraps every send and poll).
- **The request plane**: every ZeroMQ socket runs CURVE. The key pair is
  *derived* from the cluster key (``curve_seed``, HMAC-SHA256 under its own
  label), the same pair for every worker and client: a server accepts a
  client only when the client proves it holds that pair's secret (a ZAP
  handler checks the client's public key), and a client talks only to a
  server that holds it. Nothing but the key file is distributed.

The file holds at least 16 bytes of key material (surrounding whitespace is
ignored), e.g. ``head -c 32 /dev/urandom | base64 > cluster.key``; every
worker of a deployment and every client of its router reads the same file.
Without a key every worker says once at start-up that its control plane is
unauthenticated.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import zmq
from zmq.utils import z85

from ..adapters.key_file import read_key_file
from ..core.mac import ClusterKey

if TYPE_CHECKING:
    from collections.abc import Sequence


class _Advertised(Protocol):
    """What :func:`key_mismatch` reads of a P rank (``messages.RankParams``)."""

    @property
    def agent(self) -> str: ...
    @property
    def advert(self) -> dict[str, Any] | None: ...
    @property
    def key_id(self) -> str | None: ...


__all__ = ["CurveKeys", "ZapGuard", "announce", "curve", "key_mismatch", "load_cluster_key"]

log = logging.getLogger("leaseproto.auth")


def load_cluster_key(path: str | os.PathLike[str] | None) -> ClusterKey | None:
    """The key in ``path`` (None: no key). Raises ``ValueError`` naming the
    file when it cannot be read or is too short; warns once when other users
    may read it."""
    if path is None:
        return None
    raw = read_key_file(path, log=log)
    try:
        return ClusterKey.from_bytes(raw)
    except ValueError as exc:
        raise ValueError(f"cluster key file {path}: {exc}") from exc


def announce(role: str, key: ClusterKey | None) -> None:
    """Say once, at start-up, whether this worker's control plane is authenticated."""
    if key is None:
        log.warning(
            "%s: control plane UNAUTHENTICATED (no --cluster-key-file): any agent that "
            "exchanges NIXL metadata with this worker, and any client that reaches its "
            "request-plane port, is trusted (spec §10.2)",
            role,
        )
    else:
        log.info(
            "%s: control plane authenticated with cluster key %s (NIXL messages sealed "
            "with HMAC-SHA256, request plane over CURVE)",
            role,
            key.key_id,
        )


def key_mismatch(ranks: Sequence[_Advertised], ours: ClusterKey | None) -> str | None:
    """Why a decoder holding ``ours`` cannot talk to these P ranks, or None.
    A P rank that did not advertise ``leaseproto/1`` is a stock peer: it gets
    vLLM's messages, unsealed, and its reads are used unverified."""
    mine = None if ours is None else ours.key_id
    for rank in ranks:
        theirs = rank.key_id
        if rank.advert is None or theirs == mine:
            continue
        if mine is None:
            return (
                f"P agent {rank.agent} seals its messages with cluster key {theirs}; "
                "this decoder has none (--cluster-key-file)"
            )
        said = "no cluster key" if theirs is None else f"cluster key {theirs}"
        return f"P agent {rank.agent} advertised {said}, this decoder holds {mine}"
    return None


@dataclass(frozen=True, repr=False)
class CurveKeys:
    """The request plane's CURVE key pair (Z85 text), derived from the cluster key."""

    public: bytes
    secret: bytes

    @classmethod
    def from_key(cls, key: ClusterKey) -> CurveKeys:
        if not zmq.has("curve"):
            raise ValueError("this libzmq has no CURVE support: a cluster key cannot be used")
        secret = z85.encode(key.curve_seed)
        return cls(zmq.curve_public(secret), secret)

    def server(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` (before bind) a CURVE server."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True
        sock.zap_domain = b"leaseproto"

    def client(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` (before connect) a CURVE client of a keyed server."""
        sock.curve_serverkey = self.public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def curve(key: ClusterKey | None) -> CurveKeys | None:
    return None if key is None else CurveKeys.from_key(key)


class ZapGuard:
    """The ZAP handler of one context: lets in only clients whose CURVE public
    key is the cluster's (so they hold its secret); counts the rest."""

    def __init__(self, ctx: zmq.Context[Any], keys: CurveKeys) -> None:
        from zmq.auth.thread import ThreadAuthenticator  # noqa: PLC0415

        self.public = keys.public
        #: handshakes refused: a client key that is not the cluster's
        self.refused = 0
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("leaseproto.auth.zap"))
        self._auth.start()
        self._auth.configure_curve_callback(domain="leaseproto", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self.public
        if not ok:
            self.refused += 1
        return ok

    def stop(self) -> None:
        self._auth.stop()
