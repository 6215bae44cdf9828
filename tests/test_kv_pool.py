"""KVPool: allocation, layout, descriptors (no NIXL: copies follow the
descriptors with memmove, so the address arithmetic itself is checked)."""

from __future__ import annotations

import ctypes
import json

import pytest
import torch

from leaseproto.adapters.kv_pool import (
    DoubleFree,
    KVPool,
    LayoutError,
    PoolExhausted,
    PoolLayout,
    UnknownBlock,
    read_plan,
    resolve_device,
)
from leaseproto.adapters.xfer import XferDescs

GEOM = {"num_layers": 2, "num_blocks": 6, "block_size": 4, "head_dim": 3}


def make(
    num_heads: int = 4,
    head_start: int = 0,
    total: int = 4,
    dtype: torch.dtype = torch.float32,
    blocks: int = 6,
) -> KVPool:
    return KVPool(
        num_layers=GEOM["num_layers"],
        num_blocks=blocks,
        block_size=GEOM["block_size"],
        head_dim=GEOM["head_dim"],
        num_heads=num_heads,
        head_start=head_start,
        total_heads=total,
        dtype=dtype,
        device="cpu",
    )


def fill_random(pool: KVPool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in pool.tensors():
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))


def memcopy(dst: XferDescs, src: XferDescs) -> None:
    """What a NIXL READ of ``src`` into ``dst`` does, row by row."""
    assert len(dst) == len(src)
    for (daddr, dlen, _), (saddr, slen, _) in zip(dst.descs, src.descs, strict=True):
        assert dlen == slen
        ctypes.memmove(daddr, saddr, dlen)


def test_allocate_free_counts_and_lifo_reuse() -> None:
    pool = make()
    assert (pool.num_free, pool.num_used) == (6, 0)
    a = pool.allocate(2)
    b = pool.allocate(3)
    assert a == [0, 1] and b == [2, 3, 4]
    assert (pool.num_free, pool.num_used) == (1, 5)
    assert all(pool.is_allocated(x) for x in a + b) and not pool.is_allocated(5)
    pool.free(a)
    assert (pool.num_free, pool.num_used) == (3, 3)
    # freed blocks come back first, in the order they were freed
    assert pool.allocate(2) == a


def test_exhausted_allocates_nothing() -> None:
    pool = make()
    pool.allocate(5)
    with pytest.raises(PoolExhausted, match="2 blocks requested, 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1
    assert pool.allocate(0) == []


def test_double_free_and_unknown_ids_free_nothing() -> None:
    pool = make()
    ids = pool.allocate(3)
    pool.free([ids[0]])
    with pytest.raises(DoubleFree):
        pool.free([ids[1], ids[0]])
    assert pool.is_allocated(ids[1]), "a failed free must free nothing"
    with pytest.raises(DoubleFree):
        pool.free([ids[1], ids[1]])
    assert pool.is_allocated(ids[1])
    for bad in (6, -1, True, "1", 1.0):
        with pytest.raises(UnknownBlock):
            pool.free([ids[1], bad])  # type: ignore[list-item]
    assert pool.num_used == 2
    with pytest.raises(ValueError):
        pool.allocate(-1)


def test_views_share_the_registered_storage() -> None:
    pool = make()
    (data,) = pool.tensors()
    assert data.is_contiguous()
    assert pool.k(1).shape == (6, 4, 4, 3)
    pool.v(1)[2, 3, 1, 0] = 7.0
    assert data[1, 1, 2, 3, 1, 0] == 7.0


def test_layout_round_trips_through_json() -> None:
    pool = make(num_heads=2, head_start=2, dtype=torch.bfloat16)
    text = json.dumps(pool.layout())
    layout = PoolLayout.from_dict(json.loads(text))
    assert layout == pool.pool_layout
    assert layout.heads == (2, 4) and layout.elem_size == 2 and layout.dtype == "bfloat16"
    assert layout.mem_type == "DRAM"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("version", 99),
        ("num_blocks", -1),
        ("head_stride", 5),
        ("bases", [[1, 2]]),
        ("mem_type", "GPU"),
        ("head_start", 3),
        ("num_layers", "2"),
        ("bases", [[1, -2]] * 2),
    ],
)
def test_malformed_layout_is_a_layout_error(field: str, value: object) -> None:
    data = make().layout()
    data[field] = value
    with pytest.raises(LayoutError):
        PoolLayout.from_dict(data)
    data.pop(field)
    with pytest.raises(LayoutError):
        PoolLayout.from_dict(data)


def test_descriptors_match_torch_addresses() -> None:
    pool = make(num_heads=3, head_start=1)
    ids = pool.allocate(3)
    blocks = [ids[2], ids[0]]
    full = pool.descs(blocks)
    shard = pool.descs(blocks, (2, 4))
    assert len(full) == len(shard) == GEOM["num_layers"] * 2 * len(blocks)
    row = 0
    for layer in range(GEOM["num_layers"]):
        for kv in (pool.k(layer), pool.v(layer)):
            for block in blocks:
                whole, part = kv[block], kv[block, 1:3]
                assert full.descs[row] == (
                    whole.data_ptr(),
                    whole.numel() * whole.element_size(),
                    0,
                )
                assert shard.descs[row] == (part.data_ptr(), part.numel() * part.element_size(), 0)
                row += 1
    with pytest.raises(LayoutError):
        pool.descs(blocks, (0, 2))  # head 0 is not held
    with pytest.raises(UnknownBlock):
        pool.descs([ids[0], 5])  # block 5 is not allocated


def test_head_shards_assemble_into_a_full_pool() -> None:
    """P with two TP ranks (heads 0-1, 2-3) read into D holding all heads."""
    shards = [make(num_heads=2, head_start=0), make(num_heads=2, head_start=2)]
    for i, shard in enumerate(shards):
        fill_random(shard, seed=i)
    src_blocks = [shard.allocate(3)[1:] for shard in shards]  # blocks 1, 2
    full = make()
    dst_blocks = full.allocate(2)[::-1]
    for shard, blocks in zip(shards, src_blocks, strict=True):
        plan = read_plan(full.pool_layout, shard.pool_layout, dst_blocks, blocks)
        assert plan is not None
        memcopy(*plan)
    for layer in range(GEOM["num_layers"]):
        for get in (KVPool.k, KVPool.v):
            for dst, src in zip(dst_blocks, [1, 2], strict=True):
                expect = torch.cat([get(s, layer)[src] for s in shards], dim=0)
                assert torch.equal(get(full, layer)[dst], expect)


def test_full_pool_splits_into_head_shards() -> None:
    """The reverse: P with all heads, D with two ranks each reading half."""
    full = make()
    fill_random(full, seed=7)
    src = full.allocate(2)
    for start in (0, 2):
        shard = make(num_heads=2, head_start=start)
        dst = shard.allocate(2)
        plan = read_plan(shard.pool_layout, full.pool_layout, dst, src)
        assert plan is not None
        memcopy(*plan)
        for layer in range(GEOM["num_layers"]):
            assert torch.equal(shard.k(layer)[dst], full.k(layer)[src][:, start : start + 2])
            assert torch.equal(shard.v(layer)[dst], full.v(layer)[src][:, start : start + 2])


def test_read_plan_rejects_mismatches_and_skips_disjoint_heads() -> None:
    a = make(num_heads=2, head_start=0)
    b = make(num_heads=2, head_start=2)
    assert read_plan(a.pool_layout, b.pool_layout, [0], [0]) is None
    with pytest.raises(LayoutError, match="dtype"):
        read_plan(a.pool_layout, make(dtype=torch.float16).pool_layout, [0], [0])
    other = KVPool(num_layers=2, num_blocks=6, block_size=8, head_dim=3, num_heads=4, device="cpu")
    with pytest.raises(LayoutError, match="block_size"):
        read_plan(make().pool_layout, other.pool_layout, [0], [0])
    with pytest.raises(LayoutError, match="2 local blocks for 1 remote"):
        read_plan(make().pool_layout, a.pool_layout, [0, 1], [0])


def test_bad_construction_and_device() -> None:
    with pytest.raises(ValueError):
        make(num_heads=2, head_start=3)
    with pytest.raises(ValueError):
        KVPool(num_layers=2, num_blocks=0, block_size=4, head_dim=3, num_heads=1, device="cpu")
    with pytest.raises(ValueError):
        resolve_device("tpu")
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="no CUDA"):
            resolve_device("cuda")
