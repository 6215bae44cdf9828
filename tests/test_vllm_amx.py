"""AMX tiles for vLLM's CPU attention (leaseproto.integrations.vllm.amx): the
connector's worker asks Linux for them once, before any forward; without the
request vLLM 0.32's AMX attention died of SIGILL in 5 of 9 P/D runs here.
These tests need torch, not vLLM."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from leaseproto.integrations.vllm.amx import request_amx_tiles


class FakeCpu:
    def __init__(self, tiles: bool, grant: Any = True) -> None:
        self.tiles, self.grant, self.asked = tiles, grant, 0

    def _is_amx_tile_supported(self) -> bool:
        return self.tiles

    def _init_amx(self) -> bool:
        self.asked += 1
        if isinstance(self.grant, Exception):
            raise self.grant
        return bool(self.grant)


def test_a_cpu_with_tiles_asks_for_them_once(caplog: pytest.LogCaptureFixture) -> None:
    cpu = FakeCpu(tiles=True)
    with caplog.at_level(logging.INFO, logger="vllm.leaseproto.amx"):
        assert request_amx_tiles(cpu) is True
    assert cpu.asked == 1 and "AMX tiles granted" in caplog.text


def test_a_cpu_without_tiles_asks_nothing() -> None:
    cpu = FakeCpu(tiles=False)
    assert request_amx_tiles(cpu) is False and cpu.asked == 0


@pytest.mark.parametrize("grant", [False, AttributeError("no _init_amx in this torch")])
def test_a_refused_or_failed_request_is_logged_and_the_worker_goes_on(
    grant: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="vllm.leaseproto.amx"):
        assert request_amx_tiles(FakeCpu(tiles=True, grant=grant)) is False
    assert "vLLM's AMX attention may" in caplog.text


def test_the_real_torch_answers() -> None:
    torch = pytest.importorskip("torch")
    assert request_amx_tiles() is bool(torch.cpu._is_amx_tile_supported())
