"""The cluster key inside LeaseprotoConnector (spec §10.3). No vLLM import.

With ``kv_connector_extra_config: {"cluster_key_file": PATH}`` on P and D, the
connector's own messages (D's hello, P's answer to it, ``OK:``/``NK:``/``LL:``,
and the heartbeats and transfer-dones between two greeted peers) travel as the
sealed frames of §3.6, built and checked by
:class:`~leaseproto.core.mac_peers.PeerAuth` exactly as our workers do.

:class:`SealedNixl` is the one place this happens: the worker hands vLLM's
code this wrapper in place of the NIXL agent, so every ``send_notif`` and the
transfer-done vLLM attaches to a READ (``make_prepped_xfer(notif_msg=...)``)
are sealed for a peer that holds the key, and ``get_new_notifs`` returns only
what it could verify (the rest is counted and dropped, with a rate-limited
log). A message to a greeted P that has not answered the hello yet is held
and sent, sealed, once it has; a READ's transfer-done then goes after the
READ completes (vLLM's own deferred-notification path). Without a key the
worker hands vLLM the NIXL agent itself: nothing changes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from leaseproto.adapters.droplog import DropLog
from leaseproto.adapters.key_file import read_key_file
from leaseproto.core.mac import ClusterKey
from leaseproto.core.mac_peers import ANSWER, PeerAuth, Refused

from .verify import agent_name

__all__ = ["KEY_FILE", "SealedNixl", "announce", "key_problem", "load_key"]

logger = logging.getLogger("vllm.leaseproto.auth")

#: The ``kv_connector_extra_config`` key naming the cluster key file.
KEY_FILE = "cluster_key_file"
#: Messages held per greeted P until it answers (the oldest are dropped first).
MAX_HELD = 256


def load_key(extra: Mapping[str, Any] | None) -> ClusterKey | None:
    """The key named by ``extra["cluster_key_file"]`` (None: no key). Raises
    ``ValueError`` naming the key and the file when it cannot be used."""
    path = extra.get(KEY_FILE) if isinstance(extra, Mapping) else None
    if path is None:
        return None
    where = f"kv_connector_extra_config[{KEY_FILE!r}]={path!r}"
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{where}: expected the path of a key file")
    try:
        return ClusterKey.from_bytes(read_key_file(path, log=logger))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def announce(role: str, key: ClusterKey | None) -> None:
    """Say once, at start-up, whether this connector's control plane is authenticated."""
    if key is None:
        logger.warning(
            "%s: leaseproto control plane UNAUTHENTICATED (no %s in "
            "kv_connector_extra_config): any agent that exchanges NIXL metadata with this "
            "engine is trusted (spec §10.2)",
            role,
            KEY_FILE,
        )
    else:
        logger.info(
            "%s: leaseproto control plane authenticated with cluster key %s (NIXL "
            "notifications sealed with HMAC-SHA256)",
            role,
            key.key_id,
        )


def key_problem(engine: str, theirs: str | None, ours: ClusterKey | None) -> str | None:
    """Why a decoder holding ``ours`` cannot verify reads of a P engine that
    advertised ``leaseproto/1`` with key id ``theirs`` (None: no key), or None."""
    mine = None if ours is None else ours.key_id
    if theirs == mine:
        return None
    if mine is None:
        return (
            f"prefill engine {engine} seals its messages with cluster key {theirs}; "
            f"this decoder has no {KEY_FILE}"
        )
    said = "no cluster key" if theirs is None else f"cluster key {theirs}"
    return f"prefill engine {engine} advertised {said}, this decoder holds {mine}"


class SealedNixl:
    """vLLM's NIXL agent, with every notification sealed and opened by ``auth``.

    ``defer(req_id, agent, msg)`` takes the transfer-done of a READ whose P
    has not answered the hello yet (vLLM sends it once the READ completes);
    ``stat(key, n)`` counts. Every other attribute is the agent's own."""

    def __init__(
        self,
        inner: Any,
        auth: PeerAuth,
        *,
        drops: DropLog,
        stat: Callable[[str, int], None],
        defer: Callable[[str, str, bytes], None],
    ) -> None:
        self.inner = inner
        self.auth = auth
        self._drops = drops
        self._stat = stat
        self._defer = defer
        self._held: dict[str, list[bytes]] = {}
        #: (P agent, request id) of the READ vLLM is posting now (set by the worker)
        self.reading: tuple[str, str] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    # -- sending --------------------------------------------------------------------------
    def send_notif(self, remote_agent_name: str | bytes, notif_msg: bytes, **kw: Any) -> None:
        agent = agent_name(remote_agent_name)
        payload = bytes(notif_msg)
        data = None if agent in self._held else self.auth.seal(agent, payload)
        if data is None:  # a greeted P has not answered yet: sent once it has
            self._hold(agent, payload)
            return
        self.inner.send_notif(remote_agent_name, notif_msg=data, **kw)

    def make_prepped_xfer(self, *args: Any, notif_msg: bytes = b"", **kw: Any) -> Any:
        if not notif_msg or self.reading is None:
            return self.inner.make_prepped_xfer(*args, notif_msg=notif_msg, **kw)
        agent, req_id = self.reading
        data = self.auth.seal(agent, bytes(notif_msg))
        if data is None:  # no connection yet: the READ goes now, its transfer-done after it
            self._defer(req_id, agent, bytes(notif_msg))
            return self.inner.make_prepped_xfer(*args, **kw)
        return self.inner.make_prepped_xfer(*args, notif_msg=data, **kw)

    def _hold(self, agent: str, payload: bytes) -> None:
        held = self._held.setdefault(agent, [])
        held.append(payload)
        if len(held) > MAX_HELD:
            del held[0]
            self._stat("lp_auth_held_dropped", 1)

    def flush(self) -> None:
        """Send, sealed, what was held for each P that has answered since."""
        for agent, held in list(self._held.items()):
            if not self.auth.ready(agent):
                continue
            while held:
                data = self.auth.seal(agent, held[0])
                if data is None:
                    break
                del held[0]
                try:
                    self.inner.send_notif(agent, notif_msg=data)
                except Exception as exc:
                    self._stat("lp_heartbeat_send_failures", 1)
                    self._drops.drop("unsent sealed notification", f"to {agent}: {exc!r}")
            if not held:
                del self._held[agent]

    # -- receiving ------------------------------------------------------------------------
    def get_new_notifs(self, *args: Any, **kw: Any) -> dict[str, list[bytes]]:
        """What the agent received that a key holder sealed for us (the
        answers to our hellos are taken here; the rest is counted and dropped)."""
        out: dict[str, list[bytes]] = {}
        for sender, msgs in self.inner.get_new_notifs(*args, **kw).items():
            name = agent_name(sender)
            kept = []
            for raw in msgs:
                payload = self.auth.open(name, bytes(raw))
                if isinstance(payload, Refused):
                    self._stat("lp_auth_dropped", 1)
                    self._drops.drop(f"{payload.reason} notification", payload.detail)
                elif payload != ANSWER:
                    kept.append(payload)
            if kept:
                out[sender] = kept
        self.flush()
        return out
