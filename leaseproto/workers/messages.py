"""The request plane's messages as typed structs (``msgspec``).

:func:`parse` turns a message :func:`~leaseproto.workers.plane.decode` read
into its struct, checking every field's type and range; a bad field raises
:class:`~leaseproto.workers.plane.BadMessage` naming it (``Expected `int` >=
1 - at `$.max_tokens```), which the worker sends back as its error answer.
What a type cannot say (an id the wire cannot carry, a block count that does
not match the prompt) the worker still checks after parsing.

Unknown keys are ignored, so a newer peer may add fields. vLLM's NIXL
connector uses ``msgspec`` for its side channel in the same way.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import msgspec

from ..core.peer import PeerLease
from .plane import BadMessage

__all__ = [
    "Abort",
    "Decode",
    "Generate",
    "Prefill",
    "RankParams",
    "TransferParams",
    "parse",
]

_T = TypeVar("_T")

TokenIds = Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=1)]
Text = Annotated[str, msgspec.Meta(min_length=1)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Index = Annotated[int, msgspec.Meta(ge=0)]


class Generate(msgspec.Struct, kw_only=True):
    """Client -> router: decode ``max_tokens`` tokens after ``prompt``."""

    id: Any = None
    prompt: TokenIds
    max_tokens: Positive = 8
    #: a conversation id: D caches the turn, the next turn reads it as its prefix
    conversation: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


class Prefill(msgspec.Struct, kw_only=True):
    """Router -> each P rank: prefill ``prompt`` for a decode engine of ``d_tp`` ranks."""

    req_id: Text
    prompt: TokenIds
    d_tp: Positive = 1
    #: the NIXL agents of every rank of the decode engine that will read it, when
    #: the router knows them: P binds the lease to exactly these (spec §10.2)
    readers: Annotated[list[Text], msgspec.Meta(max_length=1024)] | None = None
    #: a conversation's later turn: where D cached the turn before (D's lease id
    #: as ``remote_req_id``, its ranks, the lease left as a duration) ...
    prefix: TransferParams | None = None
    #: ... and how many of the prompt's first tokens it covers
    cached: Index = 0


class Abort(msgspec.Struct, kw_only=True):
    """Router -> P rank: free ``req_id`` now (queued or granted)."""

    req_id: Text


class RankParams(msgspec.Struct, kw_only=True):
    """One P rank's share of a request: where to read it and how it is laid out
    (P's ``prefilled`` answer, forwarded by the router)."""

    rank: Index
    tp: Positive
    agent: Text
    host: Text
    nixl_port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    block_ids: tuple[Index, ...]
    layout: dict[str, Any]
    #: the lease time left when P answered, a duration (seconds)
    lease_remaining: float = 0.0
    first_token: Index | None = None
    #: P's advertised lease settings (``leaseproto/1``), if it advertised
    advert: dict[str, Any] | None = msgspec.field(default=None, name="leaseproto")

    def __post_init__(self) -> None:
        if self.advert is not None:
            PeerLease.parse(self.advert)  # a ValueError names the bad setting

    @property
    def verdicts(self) -> bool:
        """P advertised ``leaseproto/1``: it answers transfer-dones with verdicts."""
        return self.advert is not None

    @property
    def key_id(self) -> str | None:
        """The id of the cluster key P seals its messages with, if it has one
        (``auth`` in its advertisement)."""
        key = None if self.advert is None else self.advert.get("auth")
        return key if isinstance(key, str) else None

    @property
    def lease(self) -> PeerLease | None:
        """The lease settings P advertised, or None."""
        return None if self.advert is None else PeerLease.parse(self.advert)

    def as_msg(self) -> dict[str, Any]:
        """The map this was parsed from (to pass on to decode ranks 1..)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class TransferParams(msgspec.Struct, kw_only=True):
    """What D needs to read a request's KV from P (every P rank's share)."""

    remote_req_id: Text
    engine_id: Text
    ranks: Annotated[list[RankParams], msgspec.Meta(min_length=1)]
    p_tp: Positive | None = None


class Decode(msgspec.Struct, kw_only=True):
    """Router -> decode rank 0: decode a request P prefilled."""

    req_id: Text
    prompt: TokenIds
    max_tokens: Positive
    params: TransferParams
    #: keep the turn's KV cached under a lease for the conversation's next turn
    cache_turn: bool = False


def parse(msg: object, kind: type[_T]) -> _T:
    """``msg`` (a decoded map) as a ``kind``. Raises :class:`BadMessage` naming
    the bad field."""
    try:
        return msgspec.convert(msg, kind, strict=True)
    except msgspec.ValidationError as exc:
        name = getattr(kind, "__name__", str(kind)).lower()
        raise BadMessage(f"bad {name} message: {exc}") from exc
