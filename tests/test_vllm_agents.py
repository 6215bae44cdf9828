"""The agent name read from NIXL agent metadata (integrations/vllm/agents.py), which a
hello's sender must match before anything is loaded. No vLLM needed; the last test
reads real NIXL metadata and runs where NIXL is installed (the vLLM environment)."""

from __future__ import annotations

import importlib.util
import struct

import pytest

from leaseproto.integrations.vllm.agents import metadata_agent_name


def _metadata(name: str) -> bytes:
    """NIXL's layout: ``nixlSerDes|Agent``, the name's length (8 bytes LE), the name."""
    return b"nixlSerDes|Agent" + struct.pack("<Q", len(name)) + name.encode() + b"|Conns..."


def test_the_agent_name_is_read_from_the_metadata() -> None:
    assert metadata_agent_name(_metadata("a129e52b-3927")) == "a129e52b-3927"
    assert metadata_agent_name(b"meta:d-agent") is None  # not NIXL's layout
    assert metadata_agent_name(b"nixlSerDes|Agent" + struct.pack("<Q", 99) + b"x") is None
    assert metadata_agent_name(b"nixlSerDes|Agent\x01") is None  # cut short


@pytest.mark.vllm  # runs in CI's vLLM environment, which has NIXL
@pytest.mark.skipif(importlib.util.find_spec("nixl") is None, reason="NIXL is not installed")
def test_real_nixl_metadata_names_its_agent() -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("leaseproto-agents-test", nixl_agent_config(backends=["UCX"]))
    assert metadata_agent_name(agent.get_agent_metadata()) == "leaseproto-agents-test"
