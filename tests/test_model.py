"""TinyDecoder: paged prefill + decode gives the reference tokens; head
shards assemble; a corrupted or reused block shows up as different tokens."""

from __future__ import annotations

import ctypes
import random

import pytest
import torch

from leaseproto.adapters.kv_pool import KVPool, read_plan
from leaseproto.toymodel.tiny_decoder import TinyDecoder

NEW = 12


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(seed=0)


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def paged(model: TinyDecoder, prompt: list[int], pool: KVPool) -> tuple[list[int], list[int]]:
    """Prefill into freshly allocated blocks, decode from them; (tokens, blocks)."""
    blocks = pool.allocate(pool.blocks_needed(len(prompt)))
    first = model.prefill(prompt, pool, blocks)
    return model.decode(pool, blocks, len(prompt), first, NEW), blocks


def test_paged_equals_reference(model: TinyDecoder) -> None:
    pool = model.make_pool(64, 4, device="cpu")
    pool.allocate(3)  # so request blocks do not start at 0
    cases = [*prompts(8), [7], [1, 2, 3, 4], list(range(8))]  # 1 token, exact block multiples
    for prompt in cases:
        tokens, blocks = paged(model, prompt, pool)
        assert tokens == model.reference(prompt, NEW), prompt
        assert len(tokens) == NEW
        pool.free(blocks)


def test_scattered_blocks_and_a_second_pool(model: TinyDecoder) -> None:
    """Blocks in any order, and decode from a different pool holding a copy
    (what D has after its READ)."""
    prompt = prompts(1, seed=3, lo=20, hi=21)[0]
    p_pool = model.make_pool(16, 4, device="cpu")
    d_pool = model.make_pool(16, 4, device="cpu")
    p_pool.allocate(5)
    p_blocks = [14, 9, 5, 11, 7]
    p_pool.allocate(11)  # everything: the ids above are allocated
    first = model.prefill(prompt, p_pool, p_blocks)
    d_blocks = d_pool.allocate(5)
    d_pool.tensors()[0].zero_()
    for layer in range(model.config.num_layers):
        d_pool.k(layer)[d_blocks] = p_pool.k(layer)[p_blocks]
        d_pool.v(layer)[d_blocks] = p_pool.v(layer)[p_blocks]
    assert model.decode(d_pool, d_blocks, len(prompt), first, NEW) == model.reference(prompt, NEW)


def test_low_precision_pool_matches_reference_with_that_kv_dtype(model: TinyDecoder) -> None:
    pool = model.make_pool(32, 8, dtype=torch.bfloat16, device="cpu")
    for prompt in prompts(4, seed=1):
        tokens, blocks = paged(model, prompt, pool)
        assert tokens == model.reference(prompt, NEW, kv_dtype=torch.bfloat16)
        pool.free(blocks)


def test_prefill_touches_only_its_blocks(model: TinyDecoder) -> None:
    pool = model.make_pool(8, 4, device="cpu")
    blocks = pool.allocate(2)
    model.prefill([5] * 7, pool, [blocks[1], blocks[0]])
    (data,) = pool.tensors()
    written = data[:, :, [blocks[0], blocks[1]]]
    untouched = data[:, :, 2:]
    assert written.abs().sum() > 0
    assert untouched.abs().sum() == 0


def test_head_shards_decode_and_assemble(model: TinyDecoder) -> None:
    """Two P ranks (heads 0-1, 2-3): their shards decode together, and read
    into one full-head D pool (by the READ descriptors) decode alike."""
    for prompt in prompts(3, seed=2, lo=5):
        ref = model.reference(prompt, NEW)
        shards = [model.make_pool(16, 4, head_start=h, num_heads=2, device="cpu") for h in (0, 2)]
        pairs = []
        firsts = set()
        for shard in shards:
            shard.allocate(1)
            blocks = shard.allocate(shard.blocks_needed(len(prompt)))
            firsts.add(model.prefill(prompt, shard, blocks))
            pairs.append((shard, blocks))
        assert len(firsts) == 1, "every rank computes the same first token"
        first = firsts.pop()
        assert model.decode_shards(pairs[::-1], len(prompt), first, NEW) == ref
        full = model.make_pool(16, 4, device="cpu")
        dst = full.allocate(len(pairs[0][1]))[::-1]
        for shard, blocks in pairs:
            plan = read_plan(full.pool_layout, shard.pool_layout, dst, blocks)
            assert plan is not None
            for (daddr, n, _), (saddr, _, _) in zip(plan[0].descs, plan[1].descs, strict=True):
                ctypes.memmove(daddr, saddr, n)
        assert model.decode(full, dst, len(prompt), first, NEW) == ref


def test_corrupted_block_changes_the_output(model: TinyDecoder) -> None:
    prompt = prompts(1, seed=4, lo=24, hi=25)[0]
    pool = model.make_pool(16, 4, device="cpu")
    tokens, blocks = paged(model, prompt, pool)
    first = tokens[0]
    gen = torch.Generator().manual_seed(0)
    for block in blocks:
        saved = pool.tensors()[0].clone()
        for layer in range(model.config.num_layers):
            kv = pool.k(layer)[block]
            pool.k(layer)[block] = torch.randn(kv.shape, generator=gen)
        assert model.decode(pool, blocks, len(prompt), first, NEW) != tokens, block
        pool.tensors()[0].copy_(saved)
    assert model.decode(pool, blocks, len(prompt), first, NEW) == tokens


def test_reused_blocks_change_the_output(model: TinyDecoder) -> None:
    """The production failure: the lease lapsed, P gave the blocks to another
    request, D read them anyway (with the first token P computed earlier)."""
    pool = model.make_pool(32, 4, device="cpu")
    rng = random.Random(1005)  # not prompts()' stream: that would give shifted copies
    for prompt in prompts(6, seed=5, lo=4):
        other = [rng.randrange(256) for _ in range(len(prompt) + rng.randrange(4))]
        blocks = pool.allocate(pool.blocks_needed(len(prompt)))
        first = model.prefill(prompt, pool, blocks)
        pool.free(blocks)
        reused = pool.allocate(pool.blocks_needed(len(other)))
        model.prefill(other, pool, reused)
        assert set(blocks) <= set(reused), "LIFO reuse hands the freed blocks out again"
        stale = model.decode(pool, blocks, len(prompt), first, NEW)
        assert stale != model.reference(prompt, NEW)
        pool.free(reused)


def test_seed_determines_the_weights() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b, c = TinyDecoder(seed=1), TinyDecoder(seed=1), TinyDecoder(seed=2)
    assert a.reference(prompt, NEW) == b.reference(prompt, NEW)
    assert a.reference(prompt, NEW) != c.reference(prompt, NEW)
    assert len({tuple(a.reference(p, NEW)) for p in prompts(6, seed=9)}) == 6


def test_bad_input_is_a_value_error(model: TinyDecoder) -> None:
    pool = model.make_pool(4, 4, device="cpu")
    blocks = pool.allocate(2)
    for bad in ([], [256], [-1], [True], ["a"]):
        with pytest.raises(ValueError):
            model.prefill(bad, pool, blocks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="need 3 blocks"):
        model.prefill([1] * 9, pool, blocks)
    with pytest.raises(ValueError, match="not allocated"):
        model.prefill([1] * 5, pool, [blocks[0], 3])
    with pytest.raises(ValueError, match="max_positions"):
        model.reference([1] * 10, 1015)
    with pytest.raises(ValueError):
        model.reference([1], 0)
    other = TinyDecoder(num_layers=3).make_pool(4, 4, device="cpu")
    other.allocate(1)
    with pytest.raises(ValueError, match="does not fit"):
        model.prefill([1], other, [0])
    half = model.make_pool(4, 4, head_start=0, num_heads=2, device="cpu")
    half.allocate(1)
    with pytest.raises(ValueError, match="cover heads"):
        model.decode(half, [0], 2, 1, 3)
    with pytest.raises(ValueError, match="num_tokens"):
        model.decode(pool, blocks, 0, 1, 3)
