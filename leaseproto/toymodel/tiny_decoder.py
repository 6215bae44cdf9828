"""A tiny deterministic decoder whose KV cache is real data.

Seeded random weights, no downloads: a pre-norm transformer (learned token and
position embeddings, causal multi-head attention, an MLP, tied output).
Greedy decoding. The point is not language but *sensitivity*: the tokens
depend on every cached K/V row, so a decode that read freed-and-reused blocks
produces different tokens than :meth:`TinyDecoder.reference`. Random weights
with a GELU MLP fall into repeating one token, whatever the context; the MLP
here uses ``sin(mlp_gain * x)`` and small token embeddings instead, which
makes the output track the context. Measured with the defaults (seeds 0-2,
random prompts of 4-40 tokens, 12 new tokens, first token kept): replacing
all of a prompt's blocks with another prompt's changed the output in 1200 of
1200 cases, replacing one 4-token block in 1569 of 1572; relative noise of
1e-5 on the whole cache changed nothing, 1e-4 changed 1 in 300 (so rounding
differences do not flip tokens, gross corruption does).

Interface (stable; the workers are built on it)::

    TinyDecoder(*, vocab=256, num_layers=2, num_heads=4, head_dim=16, ffn=128,
                max_positions=1024, seed=0, device="cpu", threads=1)
      # also: emb_scale=0.3, mlp_gain=6.0 (see above)
      .config -> ModelConfig
      .make_pool(num_blocks, block_size, *, head_start=0, num_heads=None,
                 dtype=torch.float32, device="auto") -> KVPool
      .prefill(tokens, pool, block_ids, *, prefix=(), cached=0) -> int
          run the prompt, write K/V of the heads ``pool`` holds into
          ``block_ids`` (position i -> block i // block_size, slot
          i % block_size), return the first generated token
      .decode(pool, block_ids, num_tokens, first_token, max_new_tokens,
              *, keep=False) -> list[int]
      .decode_shards([(pool, block_ids), ...], num_tokens, first_token,
                     max_new_tokens, *, keep=False) -> list[int]
          # pools that together hold every head
      .reference(prompt, max_new_tokens, kv_dtype=torch.float32) -> list[int]

``decode`` and ``reference`` return ``max_new_tokens`` tokens, the first of
which is ``first_token`` (what ``prefill`` returned). ``decode`` reads the
prompt's K/V from the blocks once; with ``keep=True`` it also writes the new
tokens' K/V (every generated token but the last, whose K/V is never computed)
into the blocks after the prompt's, so the blocks then hold the whole turn
(``num_tokens + max_new_tokens - 1`` positions: a cached prefix). Without it
(the default) it does not write to the pool.

A cached prefix (multi-turn): ``prefill(tokens, pool, block_ids,
prefix=[(pool, block_ids), ...], cached=n)`` takes the K/V of ``tokens[:n]``
from the prefix shards (every head, e.g. read from the decoder that cached
the last turn), runs only ``tokens[n:]`` on top of it, and writes the heads
``pool`` holds of *all* ``len(tokens)`` positions into ``block_ids``.

Determinism: float32 compute, ``torch.set_num_threads(threads)`` in the
constructor (``threads=None`` leaves it alone), and the paged and reference
paths run the very same forward function on bitwise-equal K/V, so equal inputs
give equal tokens on one device. A conversation's later turn is the one
exception: its prefix K/V were computed in pieces (turn 1's prompt in one
pass, then one token per decode step, then the new tokens), the reference
computes the whole prompt in one pass, and a matrix product over a different
number of rows may round differently. Tokens still agree because rounding
noise this small does not flip them (see above; ``tests/test_model.py``
checks whole conversations against the reference). A TP rank's ``prefill`` computes every head
(the model is tiny) and stores only its own, so its shard is exactly what a
real TP rank would hold. K/V go through the pool's dtype; pass the same dtype
to ``reference`` as ``kv_dtype`` when the pool is not float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..adapters.kv_pool import KVPool, resolve_device

__all__ = ["ModelConfig", "TinyDecoder"]

_KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (K, V), each [H, T, D]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab: int = 256
    num_layers: int = 2
    num_heads: int = 4
    head_dim: int = 16
    ffn: int = 128
    max_positions: int = 1024
    seed: int = 0
    emb_scale: float = 0.3
    mlp_gain: float = 6.0

    @property
    def d_model(self) -> int:
        return self.num_heads * self.head_dim

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TinyDecoder:
    """The model; see the module docstring."""

    def __init__(
        self,
        *,
        vocab: int = 256,
        num_layers: int = 2,
        num_heads: int = 4,
        head_dim: int = 16,
        ffn: int = 128,
        max_positions: int = 1024,
        seed: int = 0,
        emb_scale: float = 0.3,
        mlp_gain: float = 6.0,
        device: str | torch.device = "cpu",
        threads: int | None = 1,
    ) -> None:
        self.config = ModelConfig(
            vocab=vocab,
            num_layers=num_layers,
            num_heads=num_heads,
            head_dim=head_dim,
            ffn=ffn,
            max_positions=max_positions,
            seed=seed,
            emb_scale=emb_scale,
            mlp_gain=mlp_gain,
        )
        for name, value in self.config.as_dict().items():
            if name in ("emb_scale", "mlp_gain"):
                if not isinstance(value, (int, float)) or not value > 0:
                    raise ValueError(f"{name} must be a number > 0, got {value!r}")
            elif (
                not isinstance(value, int)
                or isinstance(value, bool)
                or (value < 1 and name != "seed")
            ):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = resolve_device(device)
        gen = torch.Generator().manual_seed(seed)
        d = self.config.d_model

        def param(*shape: int, scale: float) -> torch.Tensor:
            w = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
            return w.to(self.device)

        self.tok_emb = param(vocab, d, scale=emb_scale)
        self.pos_emb = param(max_positions, d, scale=1.0)
        self.layers = [
            {
                "wqkv": param(d, 3 * d, scale=1.0 / math.sqrt(d)),
                "wo": param(d, d, scale=2.0 / math.sqrt(d)),
                "w1": param(d, ffn, scale=1.0 / math.sqrt(d)),
                "w2": param(ffn, d, scale=1.0 / math.sqrt(ffn)),
            }
            for _ in range(num_layers)
        ]

    # -- the forward pass (shared by every path) -----------------------------------

    def _forward(
        self, tokens: Sequence[int], past: _KV, kv_dtype: torch.dtype
    ) -> tuple[torch.Tensor, _KV]:
        """Run ``tokens`` after the ``past`` K/V; return the last position's
        logits and the new tokens' K/V (rounded through ``kv_dtype``)."""
        cfg = self.config
        n, start = len(tokens), past[0][0].shape[1] if past else 0
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)
        x = self.tok_emb[ids] + self.pos_emb[start : start + n]
        # new token i (absolute position start+i) sees positions <= start+i
        mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(start)
        new: _KV = []
        for li, w in enumerate(self.layers):
            h = F.rms_norm(x, (cfg.d_model,))
            q, k, v = (h @ w["wqkv"]).view(n, 3, cfg.num_heads, cfg.head_dim).unbind(1)
            k = k.transpose(0, 1).to(kv_dtype).to(torch.float32).contiguous()
            v = v.transpose(0, 1).to(kv_dtype).to(torch.float32).contiguous()
            new.append((k, v))
            keys = torch.cat([past[li][0], k], dim=1) if past else k
            vals = torch.cat([past[li][1], v], dim=1) if past else v
            scores = (q.transpose(0, 1) @ keys.transpose(1, 2)) / math.sqrt(cfg.head_dim)
            scores = scores.masked_fill(~mask, float("-inf"))
            att = torch.softmax(scores, dim=-1) @ vals  # [H, n, D]
            x = x + att.transpose(0, 1).reshape(n, cfg.d_model) @ w["wo"]
            x = x + torch.sin(cfg.mlp_gain * (F.rms_norm(x, (cfg.d_model,)) @ w["w1"])) @ w["w2"]
        logits = F.rms_norm(x[-1], (cfg.d_model,)) @ self.tok_emb.T
        return logits, new

    def _greedy(
        self, past: _KV, first_token: int, max_new_tokens: int, kv_dtype: torch.dtype
    ) -> tuple[list[int], _KV]:
        """The tokens, and the K/V of every position but the last token's."""
        out = [first_token]
        while len(out) < max_new_tokens:
            logits, new = self._forward([out[-1]], past, kv_dtype)
            past = [
                (torch.cat([pk, nk], dim=1), torch.cat([pv, nv], dim=1))
                for (pk, pv), (nk, nv) in zip(past, new, strict=True)
            ]
            out.append(int(torch.argmax(logits).item()))
        return out, past

    # -- public paths ----------------------------------------------------------------

    def reference(
        self, prompt: Sequence[int], max_new_tokens: int, kv_dtype: torch.dtype = torch.float32
    ) -> list[int]:
        """The tokens a single process produces without paging."""
        self._check_prompt(prompt, max_new_tokens)
        logits, kv = self._forward(prompt, [], kv_dtype)
        return self._greedy(kv, int(torch.argmax(logits).item()), max_new_tokens, kv_dtype)[0]

    def prefill(
        self,
        tokens: Sequence[int],
        pool: KVPool,
        block_ids: Sequence[int],
        *,
        prefix: Sequence[tuple[KVPool, Sequence[int]]] = (),
        cached: int = 0,
    ) -> int:
        """Write the prompt's K/V (the heads ``pool`` holds) into ``block_ids``
        and return the first generated token. ``cached``: the K/V of the first
        ``cached`` tokens are taken from ``prefix`` (shards that tile every
        head) and only the rest is run."""
        self._check_prompt(tokens, 1)
        self._check_pool(pool)
        if not isinstance(cached, int) or isinstance(cached, bool):
            raise ValueError(f"cached must be an int, got {cached!r}")
        if not 0 <= cached < len(tokens):
            raise ValueError(f"cached must be in 0..{len(tokens) - 1}, got {cached}")
        blocks = self._blocks_for(pool, block_ids, len(tokens))
        past = self._gather(prefix, cached)[0] if cached else []
        logits, new = self._forward(tokens[cached:], past, pool.dtype)
        kv = new
        if past:
            kv = [
                (torch.cat([pk, nk], dim=1), torch.cat([pv, nv], dim=1))
                for (pk, pv), (nk, nv) in zip(past, new, strict=True)
            ]
        self._store(pool, blocks, kv, 0)
        return int(torch.argmax(logits).item())

    def _store(self, pool: KVPool, blocks: Sequence[int], kv: _KV, start: int) -> None:
        """Write the heads ``pool`` holds of ``kv`` (positions ``start``..) into
        ``blocks`` (the blocks of positions 0.., already long enough)."""
        h0, h1 = pool.heads
        bs, n = pool.block_size, kv[0][0].shape[1]
        first, last = start // bs, (start + n - 1) // bs
        offset = start - first * bs  # slots of the first block already written
        index = torch.tensor(list(blocks[first : last + 1]), dtype=torch.long, device=pool.device)
        nb = last - first + 1
        for layer, (k, v) in enumerate(kv):
            for dst, src in ((pool.k(layer), k), (pool.v(layer), v)):
                new = src[h0:h1].to(device=pool.device, dtype=pool.dtype)
                if offset == 0 and n == nb * bs:
                    paged = new.view(h1 - h0, nb, bs, -1).transpose(0, 1)
                else:  # keep what the first block already holds before ``start``
                    flat = dst[index].transpose(0, 1).reshape(h1 - h0, nb * bs, -1)
                    flat[:, offset : offset + n] = new
                    paged = flat.view(h1 - h0, nb, bs, -1).transpose(0, 1)
                dst[index] = paged

    def decode(
        self,
        pool: KVPool,
        block_ids: Sequence[int],
        num_tokens: int,
        first_token: int,
        max_new_tokens: int,
        *,
        keep: bool = False,
    ) -> list[int]:
        """Greedy-decode from a prompt whose K/V (``num_tokens`` positions) sit
        in ``block_ids`` of ``pool``, which must hold every head. ``keep``:
        write the new tokens' K/V into the blocks too (they must hold
        ``num_tokens + max_new_tokens - 1`` positions)."""
        return self.decode_shards(
            [(pool, block_ids)], num_tokens, first_token, max_new_tokens, keep=keep
        )

    def decode_shards(
        self,
        shards: Sequence[tuple[KVPool, Sequence[int]]],
        num_tokens: int,
        first_token: int,
        max_new_tokens: int,
        *,
        keep: bool = False,
    ) -> list[int]:
        """:meth:`decode` from head shards: ``(pool, block_ids)`` pairs whose
        head ranges tile ``[0, num_heads)``."""
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an int >= 1, got {num_tokens!r}")
        # the prompt's tokens are not needed, only its length and the first token
        self._check_prompt([first_token], max_new_tokens, num_tokens)
        if keep:  # the blocks must hold the whole turn before anything is computed
            for pool, block_ids in shards:
                self._blocks_for(pool, block_ids, num_tokens + max_new_tokens - 1)
        past, dtype = self._gather(shards, num_tokens)
        out, kv = self._greedy(past, first_token, max_new_tokens, dtype)
        if keep and max_new_tokens > 1:
            # the generated tokens but the last: the very K/V the greedy loop used
            new = [(k[:, num_tokens:], v[:, num_tokens:]) for k, v in kv]
            for pool, block_ids in shards:
                self._store(pool, list(block_ids), new, num_tokens)
        return out

    def _gather(
        self, shards: Sequence[tuple[KVPool, Sequence[int]]], num_tokens: int
    ) -> tuple[_KV, torch.dtype]:
        """The K/V of positions ``0..num_tokens-1`` from head shards that tile
        every head, in float32 on the model's device; and their dtype."""
        cfg = self.config
        ordered = sorted(shards, key=lambda s: s[0].head_start)
        covered = 0
        for pool, _ in ordered:
            self._check_pool(pool)
            if pool.head_start != covered:
                raise ValueError(
                    f"shards leave heads {covered}..{pool.head_start - 1} uncovered or overlap"
                )
            covered = pool.heads[1]
        if covered != cfg.num_heads:
            raise ValueError(f"shards cover heads 0..{covered - 1} of {cfg.num_heads}")
        dtype = ordered[0][0].dtype
        if any(pool.dtype != dtype for pool, _ in ordered):
            raise ValueError("shards differ in dtype")
        past: _KV = []
        for layer in range(cfg.num_layers):
            parts: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
            for pool, block_ids in ordered:
                blocks = self._blocks_for(pool, block_ids, num_tokens)
                index = torch.tensor(blocks, dtype=torch.long, device=pool.device)
                for i, src in enumerate((pool.k(layer), pool.v(layer))):
                    paged = src[index].transpose(0, 1)  # [Hs, nb, bs, D]
                    flat = paged.reshape(pool.num_heads, -1, cfg.head_dim)[:, :num_tokens]
                    parts[i].append(flat.to(device=self.device, dtype=torch.float32))
            past.append((torch.cat(parts[0]).contiguous(), torch.cat(parts[1]).contiguous()))
        return past, dtype

    def make_pool(
        self,
        num_blocks: int,
        block_size: int,
        *,
        head_start: int = 0,
        num_heads: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "auto",
    ) -> KVPool:
        """A pool shaped for this model (all heads unless a shard is asked for)."""
        cfg = self.config
        return KVPool(
            num_layers=cfg.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_heads=cfg.num_heads if num_heads is None else num_heads,
            head_dim=cfg.head_dim,
            dtype=dtype,
            device=device,
            head_start=head_start,
            total_heads=cfg.num_heads,
        )

    # -- checks --------------------------------------------------------------------------

    def _check_prompt(
        self, tokens: Sequence[int], max_new_tokens: int, length: int | None = None
    ) -> None:
        cfg = self.config
        if not tokens:
            raise ValueError("the prompt is empty")
        length = len(tokens) if length is None else length
        for t in tokens:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < cfg.vocab:
                raise ValueError(f"token {t!r} is not in 0..{cfg.vocab - 1}")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if length + max_new_tokens > cfg.max_positions:
            raise ValueError(
                f"{length} prompt + {max_new_tokens} new tokens exceed "
                f"max_positions {cfg.max_positions}"
            )

    def _check_pool(self, pool: KVPool) -> None:
        cfg = self.config
        if (pool.num_layers, pool.head_dim, pool.total_heads) != (
            cfg.num_layers,
            cfg.head_dim,
            cfg.num_heads,
        ):
            raise ValueError(
                f"{pool!r} does not fit the model ({cfg.num_layers} layers, "
                f"{cfg.num_heads} heads of {cfg.head_dim})"
            )

    @staticmethod
    def _blocks_for(pool: KVPool, block_ids: Sequence[int], num_tokens: int) -> list[int]:
        need = pool.blocks_needed(num_tokens)
        if len(block_ids) < need:
            raise ValueError(
                f"{num_tokens} tokens need {need} blocks of {pool.block_size}, got {len(block_ids)}"
            )
        blocks = list(block_ids[:need])
        for block in blocks:
            if not pool.is_allocated(block):
                raise ValueError(f"block {block!r} is not allocated in {pool!r}")
        return blocks
