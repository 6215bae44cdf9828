"""I14 (model level): whole conversations served turn by turn from a cached
prefix give the tokens of ``reference`` on the full prompt.

Turn 1 as today (P prefill, D decode) but D keeps the turn's K/V in its blocks
(``decode(keep=True)``); turn 2's prompt is turn 1's prompt + its output + new
user tokens; P copies D's cached blocks (what its NIXL READ does) into a
staging pool, prefills only the new tokens on top (``prefill(prefix=...,
cached=n)``), each P rank storing its own heads; D decodes from the shards."""

from __future__ import annotations

import random

import pytest

from leaseproto.adapters.kv_pool import KVPool
from leaseproto.toymodel.tiny_decoder import TinyDecoder

NEW = 8


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(seed=0)


def copy_blocks(src: KVPool, src_blocks: list[int], dst: KVPool, dst_blocks: list[int]) -> None:
    """What a READ of every head does: the blocks' bytes, block for block."""
    h0, h1 = max(src.heads[0], dst.heads[0]), min(src.heads[1], dst.heads[1])
    for layer in range(src.num_layers):
        for s, d in ((src.k(layer), dst.k(layer)), (src.v(layer), dst.v(layer))):
            sub = d[dst_blocks]
            sub[:, h0 - dst.head_start : h1 - dst.head_start] = s[src_blocks][
                :, h0 - src.head_start : h1 - src.head_start
            ]
            d[dst_blocks] = sub


def conversation(model: TinyDecoder, turns: list[list[int]], p_tp: int, bs: int) -> list[bool]:
    """Serve ``turns`` (the user tokens of each turn); per turn, whether the
    output equals the reference on the full prompt."""
    h = model.config.num_heads
    p_pools = [
        model.make_pool(64, bs, head_start=r * h // p_tp, num_heads=h // p_tp, device="cpu")
        for r in range(p_tp)
    ]
    staging = model.make_pool(64, bs, device="cpu")
    d_pool = model.make_pool(64, bs, device="cpu")
    d_pool.allocate(3)  # so D's blocks do not start at 0
    prompt: list[int] = []
    cached: tuple[list[int], int] | None = None  # D's blocks, tokens covered
    same = []
    for user in turns:
        prompt = prompt + user
        n = 0 if cached is None else cached[1]
        p_blocks = [pool.allocate(pool.blocks_needed(len(prompt))) for pool in p_pools]
        stage: list[int] = []
        if cached is not None:
            stage = staging.allocate(staging.blocks_needed(n))
            copy_blocks(d_pool, cached[0][: len(stage)], staging, stage)
            d_pool.free(cached[0])  # P's transfer-done: D frees its cached blocks
        firsts = {
            model.prefill(prompt, pool, blocks, prefix=[(staging, stage)] if n else (), cached=n)
            for pool, blocks in zip(p_pools, p_blocks, strict=True)
        }
        assert len(firsts) == 1
        staging.free(stage)
        d_blocks = d_pool.allocate(d_pool.blocks_needed(len(prompt) + NEW - 1))
        for pool, blocks in zip(p_pools, p_blocks, strict=True):
            copy_blocks(pool, blocks, d_pool, d_blocks[: len(blocks)])
            pool.free(blocks)
        out = model.decode(d_pool, d_blocks, len(prompt), firsts.pop(), NEW, keep=True)
        same.append(out == model.reference(prompt, NEW))
        prompt = prompt + out
        cached = (d_blocks, len(prompt) - 1)
    return same


@pytest.mark.parametrize(("p_tp", "bs"), [(1, 4), (2, 4), (4, 3), (1, 16)])
def test_I14_conversations_equal_the_reference_on_the_full_prompt(
    model: TinyDecoder, p_tp: int, bs: int
) -> None:
    rng = random.Random(p_tp * 100 + bs)
    for _ in range(6):
        turns = [[rng.randrange(256) for _ in range(rng.randrange(1, 20))] for _ in range(3)]
        assert conversation(model, turns, p_tp, bs) == [True, True, True], turns


def test_keep_writes_the_turn_and_nothing_else(model: TinyDecoder) -> None:
    """``keep`` writes exactly the K/V the reference computes for the
    generated tokens (but the last) and leaves other blocks untouched."""
    pool = model.make_pool(32, 4, device="cpu")
    prompt = [5, 9, 200, 3, 17]
    blocks = pool.allocate(pool.blocks_needed(len(prompt) + NEW - 1))
    layers = range(model.config.num_layers)
    before = [t.clone() for layer in layers for t in (pool.k(layer), pool.v(layer))]
    first = model.prefill(prompt, pool, blocks)
    out = model.decode(pool, blocks, len(prompt), first, NEW, keep=True)
    full = prompt + out[:-1]
    ref = model.make_pool(32, 4, device="cpu")
    ref_blocks = ref.allocate(ref.blocks_needed(len(full)))
    model.prefill(full, ref, ref_blocks)
    for layer in range(model.config.num_layers):
        got = pool.k(layer)[blocks].transpose(0, 1).reshape(4, -1, 16)[:, : len(full)]
        want = ref.k(layer)[ref_blocks].transpose(0, 1).reshape(4, -1, 16)[:, : len(full)]
        assert (got - want).abs().max().item() < 1e-4
    untouched = [b for b in range(32) if b not in blocks]
    after = [t for layer in layers for t in (pool.k(layer), pool.v(layer))]
    for a, b in zip(before, after, strict=True):
        assert a[untouched].equal(b[untouched])


def test_keep_refuses_blocks_too_short_for_the_turn(model: TinyDecoder) -> None:
    pool = model.make_pool(8, 4, device="cpu")
    blocks = pool.allocate(2)
    first = model.prefill([1, 2, 3, 4, 5], pool, blocks)
    with pytest.raises(ValueError, match="need"):
        model.decode(pool, blocks, 5, first, NEW, keep=True)


def test_prefix_bounds_are_checked(model: TinyDecoder) -> None:
    pool = model.make_pool(8, 4, device="cpu")
    blocks = pool.allocate(2)
    for bad in (-1, 5, True):
        with pytest.raises(ValueError, match="cached"):
            model.prefill([1, 2, 3, 4, 5], pool, blocks, prefix=[(pool, blocks)], cached=bad)
