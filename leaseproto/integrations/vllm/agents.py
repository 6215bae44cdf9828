"""The agent name in NIXL agent metadata, with no vLLM import.

A hello carries its sender's NIXL agent metadata (:mod:`.verify`); the name in it
is checked against the sender before anything is loaded, so a hello carrying
another agent's metadata neither loads nor removes that agent (it may be one the
worker holds).
"""

from __future__ import annotations

import struct

__all__ = ["metadata_agent_name"]

#: NIXL's serialised agent metadata starts ``nixlSerDes|Agent`` then the name's
#: length (8 bytes, little-endian) and the name
_AGENT_TAG = b"|Agent"


def metadata_agent_name(metadata: bytes) -> str | None:
    """The agent name in NIXL agent metadata, or None when it cannot be read."""
    data = bytes(metadata)
    at = data.find(_AGENT_TAG)
    if at < 0:
        return None
    start = at + len(_AGENT_TAG) + 8
    if start > len(data):
        return None
    (size,) = struct.unpack_from("<Q", data, at + len(_AGENT_TAG))
    if size == 0 or start + size > len(data):
        return None
    try:
        return data[start : start + size].decode()
    except UnicodeDecodeError:
        return None
