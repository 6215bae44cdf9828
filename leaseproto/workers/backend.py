"""One rank's machinery: its NIXL endpoint, its paged KV pool and the model.

The workers talk to NIXL, the pool and the model only through
:class:`KVBackend`, so their loops read as protocol steps. A rank of a
``tp``-rank engine holds the heads ``[rank * H / tp, (rank + 1) * H / tp)``;
decode rank 0 keeps a pool with every head (it runs the model) and reads only
its own share from P, the rest arriving from the other decode ranks
(:meth:`KVBackend.import_shard`).

With a cluster key (``opts.cluster_key``) every notification passes through
:class:`~leaseproto.core.mac_peers.PeerAuth` here and nowhere else: what
:meth:`KVBackend.send` and :meth:`KVBackend.read` hand NIXL is sealed, and
:meth:`KVBackend.poll` returns only what it could verify (the rest is counted
and dropped, with a rate-limited log). The workers above see the same plain
messages either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from ..adapters.kv_pool import LayoutError, PoolExhausted, PoolLayout
from ..adapters.nixl import NixlEndpoint, free_port
from ..adapters.xfer import Transfer, XferDescs, XferState
from ..core.mac import FRAME_OVERHEAD
from ..core.mac_peers import PeerAuth, Refused
from ..toymodel.tiny_decoder import TinyDecoder
from .keys import announce
from .notifications import DropLog
from .trace import open_trace, text

if TYPE_CHECKING:
    from .decode_state import RankParams
    from .loop import RankOptions

__all__ = ["KVBackend", "head_range", "reference_tokens", "vocab_size"]


def head_range(rank: int, tp: int, num_heads: int) -> tuple[int, int]:
    """The global heads rank ``rank`` of ``tp`` holds."""
    if tp < 1 or num_heads % tp:
        raise ValueError(f"{num_heads} heads cannot be split over {tp} ranks")
    per = num_heads // tp
    return rank * per, (rank + 1) * per


@cache
def _model(seed: int, device: str) -> TinyDecoder:
    return TinyDecoder(seed=seed, device=device)


def vocab_size(seed: int = 0) -> int:
    return TinyDecoder(seed=seed).config.vocab


def reference_tokens(
    prompt: Sequence[int], max_tokens: int, *, seed: int = 0, device: str = "cpu"
) -> list[int]:
    """What one process produces for ``prompt`` without paging or transfers."""
    return _model(seed, device).reference(list(prompt), max_tokens)


class KVBackend:
    """Endpoint + pool + model of one rank."""

    def __init__(
        self, opts: RankOptions, *, agent_name: str, role: str, full_heads: bool = False
    ) -> None:
        """``full_heads``: hold every head (decode rank 0, which runs the model),
        not just this rank's share. ``role`` names the worker in its trace
        (``opts.trace``; :mod:`.trace`), which records every notification sent,
        received and attached to a READ."""
        self.trace = open_trace(
            opts.trace,
            role=role,
            engine=str(getattr(opts, "engine_id", "")),
            rank=opts.rank,
            tp=opts.tp,
            agent=agent_name,
            config=opts.config,
            policy=opts.policy,
            verify_reads=bool(getattr(opts, "verify_reads", True)),
        )
        self.model = TinyDecoder(seed=opts.model_seed, device=opts.device)
        cfg = self.model.config
        self.rank_heads = head_range(opts.rank, opts.tp, cfg.num_heads)
        h0, h1 = (0, cfg.num_heads) if full_heads else self.rank_heads
        self.pool = self.model.make_pool(
            opts.num_blocks, opts.block_size, head_start=h0, num_heads=h1 - h0, device=opts.device
        )
        self.agent_name = agent_name
        self.nixl_port = opts.nixl_port or free_port(opts.host)
        # a decode rank talks only to agents it fetched from (names bound to
        # addresses): metadata pushed to it under another name is refused; and
        # it pushes its own again after a quiet spell (P forgets silent decoders)
        decode = role == "decode"
        self.endpoint = NixlEndpoint(
            agent_name,
            host=opts.host,
            port=self.nixl_port,
            accept_pushed=not decode,
            repush_idle=2.0 * opts.config.heartbeat_interval if decode else None,
        )
        self.pool.register_with(self.endpoint)  # before anyone connects
        #: a prefill rank's every-head pool for prefixes read from D (:mod:`.prefill_prefix`)
        self.staging = self.model.make_pool(
            opts.num_blocks if role == "prefill" else 1, opts.block_size, device=opts.device
        )
        if role == "prefill":
            self.staging.register_with(self.endpoint)
        key = getattr(opts, "cluster_key", None)
        announce(f"{role} rank {opts.rank} ({agent_name})", key)
        #: the cluster key's connections (None: no key, nothing is sealed)
        self.auth = None if key is None else PeerAuth(key, agent_name)
        self._auth_drops = DropLog(logging.getLogger("leaseproto.auth"))

    # -- transport (the endpoint never raises transport errors) ----------------------------
    def connect(
        self,
        agent: str,
        host: str,
        port: int,
        *,
        keyed: bool = False,
        layout: dict[str, Any] | None = None,
    ) -> None:
        """Start the handshake with ``agent`` at ``host:port``. ``keyed``: the
        peer advertised our cluster key, so what we send it is sealed (and
        waits for its answer to our greeting, :meth:`ready`). ``layout``: the
        pool layout that P rank gave in its transfer parameters; the agent is
        connected only once the metadata loaded under its name covers that
        pool (the metadata of whoever else took the name is dropped)."""
        probe = None
        if layout is not None:
            try:
                probe = PoolLayout.from_dict(layout).descs([0])
            except ValueError:
                probe = None  # read_plan refuses the request with the reason
        self.endpoint.connect(agent, host, port, probe=probe)
        if keyed and self.auth is not None:
            self.auth.expect(agent)

    def is_connected(self, agent: str) -> bool:
        return self.endpoint.is_connected(agent)

    def ready(self, agent: str) -> bool:
        """Connected, and (with a key) a greeted peer answered: messages can go."""
        return self.endpoint.is_connected(agent) and (self.auth is None or self.auth.ready(agent))

    @property
    def frame_overhead(self) -> int:
        """Bytes sealing adds to a message (0 without a key)."""
        return 0 if self.auth is None else FRAME_OVERHEAD

    def _seal(self, agent: str, payload: bytes) -> bytes | None:
        return payload if self.auth is None else self.auth.seal(agent, payload)

    def forget(self, agent: str) -> None:
        """Drop ``agent``'s NIXL metadata and our record of it. With a cluster
        key its connection state is kept: a decoder that comes back (it pushes
        its metadata again) goes on sealing on the same connection."""
        self.endpoint.forget(agent)

    def send(self, agent: str, payload: bytes) -> bool:
        """False when NIXL refused it, or (with a key) no connection to a
        greeted peer is up yet."""
        data = self._seal(agent, payload)
        if not self.trace.enabled:
            return data is not None and self.endpoint.send(agent, data)
        sent_at = time.monotonic()  # before the send: its receiver may log it at once
        ok = data is not None and self.endpoint.send(agent, data)
        self.trace.emit("send", stamp=sent_at, to=agent, data=text(payload), ok=ok)
        return ok

    def poll(self) -> list[tuple[str, bytes]]:
        got = self.endpoint.poll()
        if self.auth is not None:
            got = self._open(got)
        if self.trace.enabled:
            for sender, payload in got:
                self.trace.emit("recv", src=sender, data=text(payload))
        return got

    def _open(self, got: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        assert self.auth is not None
        out = []
        for sender, data in got:
            payload = self.auth.open(sender, data)
            if isinstance(payload, Refused):
                self._auth_drops.drop(f"{payload.reason} notification", payload.detail)
            else:
                out.append((sender, payload))
        self._auth_drops.flush()
        return out

    def auth_stats(self) -> dict[str, object]:
        """What the cluster key refused (empty without a key)."""
        if self.auth is None:
            return {}
        return {
            "cluster_key": self.auth.key.key_id,
            "auth_dropped": dict(self.auth.dropped),
            "auth_unsealed": self.auth.unsealed,
        }

    def take_lost_peers(self) -> list[tuple[str, str]]:
        return self.endpoint.take_lost_peers()

    def read(
        self, agent: str, local: XferDescs, remote: XferDescs, *, notif_msg: bytes
    ) -> Transfer:
        if self.trace.enabled:
            self.trace.emit("read", to=agent, data=text(notif_msg))
        # None: no connection yet (the workers read only once P answered the
        # greeting); the bare notification is then dropped by P, and the verdict
        # D does not get turns the read into a recompute
        sealed = self._seal(agent, notif_msg)
        return self.endpoint.read(agent, local, remote, notif_msg=sealed or notif_msg)

    def transfer_state(self, xfer: Transfer) -> XferState:
        return self.endpoint.transfer_state(xfer)

    def release(self, xfer: Transfer) -> None:
        self.endpoint.release(xfer)

    def close(self) -> None:
        self.endpoint.close()
        self.trace.close()

    # -- blocks ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.pool.num_free

    def alloc_for(self, num_tokens: int) -> list[int] | None:
        """Blocks for ``num_tokens`` tokens, or ``None`` when the pool is short."""
        try:
            return self.pool.allocate(self.pool.blocks_needed(num_tokens))
        except PoolExhausted:
            return None

    def free(self, blocks: Sequence[int]) -> None:
        if blocks:
            self.pool.free(blocks)

    def layout(self) -> dict[str, Any]:
        return self.pool.layout()

    # -- the model ------------------------------------------------------------------------
    def check_prompt(
        self, prompt: Sequence[int], max_tokens: int = 1, first_token: int | None = None
    ) -> str | None:
        """Why this rank can never serve the request, or None: a token outside
        the vocabulary, more positions than the model has, or more blocks
        than the whole pool (refused at intake: such a request would wait for
        blocks forever)."""
        cfg = self.model.config
        bad = [t for t in prompt if not 0 <= t < cfg.vocab]
        if first_token is not None and not 0 <= first_token < cfg.vocab:
            bad.insert(0, first_token)
        if bad:
            return f"token {bad[0]} is not in 0..{cfg.vocab - 1}"
        if len(prompt) + max_tokens > cfg.max_positions:
            return f"{len(prompt)} + {max_tokens} tokens exceed {cfg.max_positions} positions"
        need = self.pool.blocks_needed(len(prompt))
        if need > self.pool.num_blocks:
            return (
                f"a {len(prompt)}-token prompt needs {need} blocks; this pool holds "
                f"{self.pool.num_blocks}"
            )
        return None

    def limits(self) -> dict[str, int]:
        """What a request must fit (the router refuses the rest at intake)."""
        return {
            "max_positions": self.model.config.max_positions,
            "num_blocks": self.pool.num_blocks,
            "block_size": self.pool.block_size,
        }

    def prefill(
        self,
        prompt: Sequence[int],
        blocks: Sequence[int],
        *,
        staged: Sequence[int] = (),
        cached: int = 0,
    ) -> int:
        """Write this pool's heads of the prompt's K/V; the first generated
        token. ``cached``: the first ``cached`` tokens' K/V are in ``staged``
        blocks of the staging pool (a prefix read from D); only the rest runs."""
        prefix = [(self.staging, staged)] if cached else []
        return self.model.prefill(list(prompt), self.pool, blocks, prefix=prefix, cached=cached)

    def decode(
        self,
        blocks: Sequence[int],
        num_tokens: int,
        first_token: int,
        max_tokens: int,
        *,
        keep: bool = False,
    ) -> list[int]:
        """``keep``: write the turn's new K/V into ``blocks`` too (a cached turn)."""
        return self.model.decode(self.pool, blocks, num_tokens, first_token, max_tokens, keep=keep)

    # -- transfers ------------------------------------------------------------------------
    def read_plan(
        self,
        ranks: Sequence[RankParams],
        blocks: Sequence[int],
        num_tokens: int,
        *,
        into: str = "pool",
    ) -> list[tuple[RankParams, XferDescs, XferDescs]]:
        """For each remote rank holding some of *this rank's* heads: the local
        and remote descriptors of those heads of the prompt's blocks.
        ``into="staging"``: every head, into the staging pool (a prefix P reads
        from D's ranks, whatever their TP).

        Raises:
            LayoutError: a P rank's layout is malformed or does not fit ours.
        """
        pool = self.staging if into == "staging" else self.pool
        local = pool.pool_layout
        need = pool.blocks_needed(num_tokens)
        mine = pool.heads if into == "staging" else self.rank_heads
        out = []
        for rank in ranks:
            remote = PoolLayout.from_dict(rank.layout)
            local.compatible(remote)
            if len(rank.block_ids) < need:
                raise LayoutError(
                    f"P rank {rank.rank} holds {len(rank.block_ids)} blocks, {need} needed"
                )
            h0 = max(mine[0], remote.heads[0])
            h1 = min(mine[1], remote.heads[1])
            if h0 >= h1:
                continue
            out.append(
                (
                    rank,
                    pool.descs(list(blocks[:need]), (h0, h1)),
                    remote.descs(list(rank.block_ids[:need]), (h0, h1)),
                )
            )
        if not out:
            raise LayoutError(f"no P rank holds heads {mine}")
        return out

    def export_shard(self, blocks: Sequence[int], num_tokens: int) -> bytes:
        """This pool's K/V of the prompt's blocks, as bytes for rank 0."""
        index = torch.tensor(
            list(blocks[: self.pool.blocks_needed(num_tokens)]),
            dtype=torch.long,
            device=self.pool.device,
        )
        parts = [
            src[index]
            for layer in range(self.pool.num_layers)
            for src in (self.pool.k(layer), self.pool.v(layer))
        ]
        data: bytes = torch.stack(parts).contiguous().cpu().view(torch.uint8).numpy().tobytes()
        return data

    def import_shard(
        self, rank: int, tp: int, blocks: Sequence[int], num_tokens: int, data: bytes
    ) -> None:
        """Copy decode rank ``rank``'s shard (from :meth:`export_shard`) into
        the matching heads of our blocks.

        Raises:
            ValueError: the bytes do not have the shard's size.
        """
        h0, h1 = head_range(rank, tp, self.model.config.num_heads)
        lo, hi = h0 - self.pool.head_start, h1 - self.pool.head_start
        nb = self.pool.blocks_needed(num_tokens)
        shape = (self.pool.num_layers * 2, nb, h1 - h0, self.pool.block_size, self.pool.head_dim)
        expected = torch.Size(shape).numel() * self.pool.pool_layout.elem_size
        if not isinstance(data, (bytes, bytearray)) or len(data) != expected:
            raise ValueError(f"shard of decode rank {rank} is not {expected} bytes")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(self.pool.dtype)
        parts = flat.view(shape).to(self.pool.device)
        index = torch.tensor(list(blocks[:nb]), dtype=torch.long, device=self.pool.device)
        i = 0
        for layer in range(self.pool.num_layers):
            for dst in (self.pool.k(layer), self.pool.v(layer)):
                sub = dst[index]
                sub[:, lo:hi] = parts[i]
                dst[index] = sub
                i += 1
