"""Intel AMX on CPU workers: ask Linux for the tile registers before vLLM's
attention kernel uses them.

vLLM 0.32 picks its ``amx`` CPU attention (bf16, block sizes a multiple of 32)
whenever the CPU has AMX tiles, but never asks the kernel for them: Linux lets a
process execute AMX instructions only after ``arch_prctl(ARCH_REQ_XCOMP_PERM)``,
which oneDNN makes only when one of its own AMX kernels runs first. When none
has, the first attention step dies of SIGILL. Measured here with
``benchmarks/vllm_pd.py`` (a leaseproto P/D pair, 6 requests): the decode
worker died of SIGILL in its first decode step after a KV transfer in 5 of 9
runs without the request, in none of 8 with it (2026-12-03). The request is per process and
idempotent, so the connector makes it once as each worker starts; this module
imports only torch.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["request_amx_tiles"]

logger = logging.getLogger("vllm.leaseproto.amx")


def request_amx_tiles(torch_cpu: Any = None) -> bool:
    """Ask for AMX tiles when this CPU has them. True when granted; False when
    the CPU has none or the request failed (logged: vLLM's AMX attention may
    then die of SIGILL). ``torch_cpu`` is ``torch.cpu`` (injectable for tests)."""
    if torch_cpu is None:
        import torch  # only CPU workers need it

        torch_cpu = torch.cpu
    try:
        if not torch_cpu._is_amx_tile_supported():
            return False
        granted = bool(torch_cpu._init_amx())
    except Exception as exc:  # a torch without these private helpers: say so, go on
        logger.warning("Could not ask Linux for AMX tiles (%s): vLLM's AMX attention may fail", exc)
        return False
    if granted:
        logger.info("AMX tiles granted to this worker (vLLM's CPU attention uses them)")
    else:
        logger.warning("Linux refused AMX tiles: vLLM's AMX attention may die of SIGILL")
    return granted
