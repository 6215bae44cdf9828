"""Errors: local misuse versus remote protocol violations (spec §10).

Late messages are *not* errors: a heartbeat or transfer-done that arrives after
a lease ended is normal under reordering and is counted, never raised.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LeaseProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
]


class LeaseProtocolError(Exception):
    """Base of every protocol error. Abstract: raise a subclass."""

    def __new__(cls, *args: Any, **kwargs: Any) -> LeaseProtocolError:
        if cls is LeaseProtocolError:
            raise TypeError(
                "LeaseProtocolError is abstract: raise LocalProtocolError or RemoteProtocolError"
            )
        return super().__new__(cls, *args, **kwargs)


class LocalProtocolError(LeaseProtocolError):
    """The caller broke the protocol: granting a live lease, ``now`` going
    backwards, tracking a request twice. The object's state is unchanged."""


class RemoteProtocolError(LeaseProtocolError):
    """The peer sent something no reordering or delay can explain, such as a
    message that does not parse. The message is dropped; no state changes."""
