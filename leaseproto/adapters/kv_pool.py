"""A paged KV block pool in torch, laid out for NIXL reads of head shards.

Storage is one contiguous tensor ``[num_layers, 2 (K, V), num_blocks,
num_heads, block_size, head_dim]``: for every layer and K/V, a block is
``[num_heads, block_size, head_dim]`` and any head range of one block is one
contiguous byte range. That is what heterogeneous TP needs: a P rank holding
heads 0-1 and one holding heads 2-3 can each be read straight into the
matching half of a D block that holds all four, and the reverse.

A pool holds the global heads ``[head_start, head_start + num_heads)`` of a
model with ``total_heads`` heads. Head ranges in this module are always
*global* head indices.

Interface (stable; the workers are built on it)::

    KVPool(*, num_layers, num_blocks, block_size, num_heads, head_dim,
           dtype=torch.float32, device="auto", head_start=0, total_heads=None)
      .k(layer) / .v(layer) -> Tensor [num_blocks, num_heads, block_size, head_dim]
      .tensors() -> list[Tensor]            # what to register with NIXL
      .register_with(endpoint) -> None      # endpoint.register(self.tensors())
      .allocate(n) -> list[int]             # PoolExhausted; all or nothing
      .free(block_ids) -> None              # UnknownBlock / DoubleFree; all or nothing
      .num_free, .num_used, .num_blocks, .is_allocated(b), .blocks_needed(num_tokens)
      .layout() -> dict                     # JSON-able; what the router passes on
      .pool_layout -> PoolLayout
      .descs(block_ids, heads=None) -> XferDescs   # local descriptors (allocated blocks)
    PoolLayout.from_dict(d) -> PoolLayout   # LayoutError on anything malformed
      .descs(block_ids, heads=None) -> XferDescs   # e.g. a peer's blocks
      .heads -> (start, stop)
    read_plan(local, remote, local_blocks, remote_blocks)
        -> tuple[XferDescs, XferDescs] | None      # the heads both hold; None if none
    resolve_device("auto"|"cpu"|"cuda") -> torch.device

Descriptor rows are ordered layer, then K before V, then the block ids in the
order given: the local and remote lists of :func:`read_plan` pair up row by
row, as :meth:`~leaseproto.adapters.nixl.NixlEndpoint.read` requires.

Freed blocks are reused last-in first-out and never scrubbed, so a read of a
freed block that was handed to another request returns that request's data,
as in production.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .kv_layout import (
    LAYOUT_VERSION,
    LayoutError,
    PoolError,
    PoolLayout,
    UnknownBlock,
    read_plan,
)
from .xfer import XferDescs

if TYPE_CHECKING:
    from .nixl import NixlEndpoint

__all__ = [
    "LAYOUT_VERSION",
    "DoubleFree",
    "KVPool",
    "LayoutError",
    "PoolError",
    "PoolExhausted",
    "PoolLayout",
    "UnknownBlock",
    "read_plan",
    "resolve_device",
]


class PoolExhausted(PoolError):
    """Fewer free blocks than requested."""


class DoubleFree(PoolError):
    """A block that is not allocated (or named twice) was freed."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else CPU. ``"cuda"`` without CUDA is
    a ``ValueError``."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {name!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return dev


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class KVPool:
    """Paged K/V storage with a free list. Not thread-safe (one engine loop)."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "auto",
        head_start: int = 0,
        total_heads: int | None = None,
    ) -> None:
        sizes = {
            "num_layers": num_layers,
            "num_blocks": num_blocks,
            "block_size": block_size,
            "num_heads": num_heads,
            "head_dim": head_dim,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        total = num_heads if total_heads is None else total_heads
        if head_start < 0 or head_start + num_heads > total:
            raise ValueError(
                f"heads [{head_start}, {head_start + num_heads}) do not fit in total_heads {total}"
            )
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
        self.device = resolve_device(device)
        self.dtype = dtype
        self.num_layers = num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.head_start = head_start
        self.total_heads = total
        self._data = torch.zeros(
            num_layers,
            2,
            num_blocks,
            num_heads,
            block_size,
            head_dim,
            dtype=dtype,
            device=self.device,
        )
        # a stack: allocate pops from the end, free pushes; block 0 comes first
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._used: set[int] = set()
        self._layout = self._make_layout()

    # -- data -------------------------------------------------------------------

    def k(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s keys: ``[num_blocks, num_heads, block_size, head_dim]``."""
        return self._data[layer, 0]

    def v(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s values, shaped like :meth:`k`."""
        return self._data[layer, 1]

    def tensors(self) -> list[torch.Tensor]:
        """The tensors to register with NIXL (one contiguous allocation)."""
        return [self._data]

    def register_with(self, endpoint: NixlEndpoint) -> None:
        endpoint.register(self.tensors())

    @property
    def heads(self) -> tuple[int, int]:
        return (self.head_start, self.head_start + self.num_heads)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- allocation ---------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def is_allocated(self, block: int) -> bool:
        return block in self._used

    def allocate(self, n: int) -> list[int]:
        """``n`` free block ids, or ``PoolExhausted`` (nothing allocated)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"block count must be an int >= 0, got {n!r}")
        if n > len(self._free):
            raise PoolExhausted(
                f"{n} blocks requested, {len(self._free)} free of {self.num_blocks}"
            )
        ids = [self._free.pop() for _ in range(n)]
        self._used.update(ids)
        return ids

    def free(self, block_ids: Sequence[int]) -> None:
        """Return blocks to the pool. Every id is checked first: an unknown id
        raises ``UnknownBlock``, one not allocated (or listed twice)
        ``DoubleFree``, and then nothing is freed."""
        seen: set[int] = set()
        for block in block_ids:
            self._check_id(block)
            if block not in self._used or block in seen:
                raise DoubleFree(f"block {block} is not allocated (double free)")
            seen.add(block)
        self._used.difference_update(seen)
        self._free.extend(reversed(list(block_ids)))

    def _check_id(self, block: object) -> None:
        if (
            not isinstance(block, int)
            or isinstance(block, bool)
            or not 0 <= block < self.num_blocks
        ):
            raise UnknownBlock(f"block {block!r} is not in 0..{self.num_blocks - 1}")

    # -- layout and descriptors ------------------------------------------------------

    @property
    def pool_layout(self) -> PoolLayout:
        return self._layout

    def layout(self) -> dict[str, Any]:
        """JSON-able description of this pool's memory (see :class:`PoolLayout`)."""
        return self._layout.as_dict()

    def descs(self, block_ids: Sequence[int], heads: tuple[int, int] | None = None) -> XferDescs:
        """Descriptors of our own blocks; every block must be allocated."""
        for block in block_ids:
            self._check_id(block)
            if block not in self._used:
                raise UnknownBlock(f"block {block} is not allocated")
        return self._layout.descs(block_ids, heads)

    def _make_layout(self) -> PoolLayout:
        elem = self._data.element_size()
        head_stride = self.block_size * self.head_dim * elem
        block_stride = self.num_heads * head_stride
        base = self._data.data_ptr()
        per_kv = self.num_blocks * block_stride
        bases = tuple(
            (base + (2 * layer) * per_kv, base + (2 * layer + 1) * per_kv)
            for layer in range(self.num_layers)
        )
        is_cuda = self.device.type == "cuda"
        return PoolLayout(
            num_layers=self.num_layers,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            num_heads=self.num_heads,
            head_start=self.head_start,
            total_heads=self.total_heads,
            head_dim=self.head_dim,
            dtype=_dtype_name(self.dtype),
            elem_size=elem,
            mem_type="VRAM" if is_cuda else "DRAM",
            device_id=self._data.get_device() if is_cuda else 0,
            block_stride=block_stride,
            head_stride=head_stride,
            bases=bases,
        )

    def __repr__(self) -> str:
        return (
            f"KVPool(layers={self.num_layers}, blocks={self.num_blocks}x{self.block_size}, "
            f"heads={self.heads} of {self.total_heads}, head_dim={self.head_dim}, "
            f"dtype={_dtype_name(self.dtype)}, device={self.device}, used={self.num_used})"
        )
