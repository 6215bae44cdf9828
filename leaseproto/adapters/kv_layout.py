"""Where a KV pool's blocks live, in bytes: the layout a pool publishes and a
peer reads with NIXL, and the plan pairing two layouts' heads row by row.

Torch-free (a layout is plain numbers), so anything that only passes layouts on
or checks them needs no torch. :mod:`leaseproto.adapters.kv_pool` builds the
layout of a real pool and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .xfer import XferDescs

__all__ = [
    "LAYOUT_VERSION",
    "LayoutError",
    "PoolError",
    "PoolLayout",
    "UnknownBlock",
    "read_plan",
]

LAYOUT_VERSION = 1


class PoolError(Exception):
    """Base of the pool's errors; nothing in the pool changed."""


class UnknownBlock(PoolError, ValueError):
    """Not a block id of this pool (wrong type or out of range), or a block
    that must be allocated is not."""


class LayoutError(ValueError):
    """A layout description that is malformed or does not fit the other side
    (count it and fail the request: it came from a peer)."""


_INT_FIELDS = (
    "num_layers",
    "num_blocks",
    "block_size",
    "num_heads",
    "head_start",
    "total_heads",
    "head_dim",
    "elem_size",
    "device_id",
    "block_stride",
    "head_stride",
)


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """Where a pool's blocks live, in bytes. ``bases[layer] = (K, V)``
    addresses of block 0 of that layer."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_heads: int
    head_start: int
    total_heads: int
    head_dim: int
    dtype: str
    elem_size: int
    mem_type: str
    device_id: int
    block_stride: int
    head_stride: int
    bases: tuple[tuple[int, int], ...]

    @property
    def heads(self) -> tuple[int, int]:
        return (self.head_start, self.head_start + self.num_heads)

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": LAYOUT_VERSION,
            **{name: getattr(self, name) for name in _INT_FIELDS},
            "dtype": self.dtype,
            "mem_type": self.mem_type,
            "bases": [list(pair) for pair in self.bases],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolLayout:
        """Parse :meth:`as_dict`'s output (e.g. from a peer); ``LayoutError``
        names the first problem."""
        if not isinstance(data, Mapping):
            raise LayoutError(f"layout must be a mapping, got {type(data).__name__}")
        if data.get("version") != LAYOUT_VERSION:
            raise LayoutError(f"layout version {data.get('version')!r} is not {LAYOUT_VERSION}")
        ints: dict[str, int] = {}
        for name in _INT_FIELDS:
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise LayoutError(f"layout field {name!r} must be an int >= 0, got {value!r}")
            ints[name] = value
        for name in ("dtype", "mem_type"):
            if not isinstance(data.get(name), str):
                raise LayoutError(f"layout field {name!r} must be a str")
        if data["mem_type"] not in ("DRAM", "VRAM"):
            raise LayoutError(f"layout mem_type {data['mem_type']!r} is not DRAM or VRAM")
        bases = data.get("bases")
        if not isinstance(bases, (list, tuple)) or len(bases) != ints["num_layers"]:
            raise LayoutError("layout bases must list one (K, V) pair per layer")
        pairs: list[tuple[int, int]] = []
        for pair in bases:
            if (
                not isinstance(pair, (list, tuple))
                or len(pair) != 2
                or any(not isinstance(a, int) or isinstance(a, bool) or a < 0 for a in pair)
            ):
                raise LayoutError(f"layout base {pair!r} is not a pair of addresses")
            pairs.append((int(pair[0]), int(pair[1])))
        layout = cls(**ints, dtype=data["dtype"], mem_type=data["mem_type"], bases=tuple(pairs))
        layout._check_geometry()
        return layout

    def _check_geometry(self) -> None:
        if (
            min(
                self.num_layers,
                self.num_blocks,
                self.block_size,
                self.num_heads,
                self.head_dim,
                self.elem_size,
            )
            < 1
        ):
            raise LayoutError("layout sizes must be >= 1")
        if self.head_start + self.num_heads > self.total_heads:
            raise LayoutError(f"heads {self.heads} exceed total_heads {self.total_heads}")
        if (
            self.head_stride != self.block_size * self.head_dim * self.elem_size
            or self.block_stride != self.num_heads * self.head_stride
        ):
            raise LayoutError("layout strides do not match its shape")

    def descs(self, block_ids: Sequence[int], heads: tuple[int, int] | None = None) -> XferDescs:
        """Descriptors of these blocks, restricted to the global head range
        ``heads`` (default: all heads held)."""
        h0, h1 = self.heads if heads is None else heads
        if not self.head_start <= h0 < h1 <= self.head_start + self.num_heads:
            raise LayoutError(f"head range {(h0, h1)} is not within held heads {self.heads}")
        for block in block_ids:
            if (
                not isinstance(block, int)
                or isinstance(block, bool)
                or not 0 <= block < self.num_blocks
            ):
                raise UnknownBlock(f"block {block!r} is not in 0..{self.num_blocks - 1}")
        offset = (h0 - self.head_start) * self.head_stride
        nbytes = (h1 - h0) * self.head_stride
        rows = tuple(
            (base + block * self.block_stride + offset, nbytes, self.device_id)
            for pair in self.bases
            for base in pair
            for block in block_ids
        )
        return XferDescs(self.mem_type, rows)

    def compatible(self, other: PoolLayout) -> None:
        """``LayoutError`` unless blocks of ``other`` can be copied into ours
        head by head (same model geometry and dtype)."""
        for name in ("num_layers", "block_size", "total_heads", "head_dim", "dtype", "elem_size"):
            if getattr(self, name) != getattr(other, name):
                raise LayoutError(
                    f"layouts differ in {name}: {getattr(self, name)!r} vs {getattr(other, name)!r}"
                )


def read_plan(
    local: PoolLayout, remote: PoolLayout, local_blocks: Sequence[int], remote_blocks: Sequence[int]
) -> tuple[XferDescs, XferDescs] | None:
    """Descriptors that READ the heads both pools hold from ``remote_blocks``
    into ``local_blocks`` (same count, i-th into i-th). None when the pools
    share no head (that remote rank holds nothing this side needs)."""
    local.compatible(remote)
    if len(local_blocks) != len(remote_blocks):
        raise LayoutError(
            f"{len(local_blocks)} local blocks for {len(remote_blocks)} remote blocks"
        )
    h0 = max(local.head_start, remote.head_start)
    h1 = min(local.heads[1], remote.heads[1])
    if h0 >= h1 or not local_blocks:
        return None
    return local.descs(local_blocks, (h0, h1)), remote.descs(remote_blocks, (h0, h1))
