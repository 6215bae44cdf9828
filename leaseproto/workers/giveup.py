"""The router's give-up rule: whom it tells to abort a request it fails.

A request the router fails is one no client awaits any more, so nothing may
stay held for it (spec §2.1, I17): every P rank that may hold its lease is sent
``abort`` on the request plane (P frees the blocks at once instead of at
expiry, or drops the queued prefill), and D, when it has the request and did
not itself answer, is sent ``abort`` too (it stops heartbeating, tells P
``AB:`` and frees its slot). The rule is plain data in, plain data out, so the
router (:mod:`.router`) and the model checker (scope ``giveup``) run the same
function.

========================= ========= ================================ =========
cause                     stage     P ranks told                     D told
========================= ========= ================================ =========
``unsent``                prefill   every rank                       no
``rank_failed`` (rank k)  prefill   every rank but k (it holds none) no
``lost`` (P rank k)       prefill   every rank but k (unreachable)   no
``decode_unreachable``    prefill   every rank                       no
``decode_failed``         decode    every rank                       no (it answered)
``lost`` (D, no rank)     decode    none: D may still read; the      no
                                    leases lapse (I5, I6)
``timeout``               either    every rank                       in decode
========================= ========= ================================ =========
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["CAUSES", "GiveUp", "give_up"]

#: why the router fails a request (the table above)
CAUSES: Final = (
    "unsent",
    "rank_failed",
    "lost",
    "decode_unreachable",
    "decode_failed",
    "timeout",
)

#: the stage each cause may come in (``timeout``: either)
_STAGES: Final = {
    "unsent": ("prefill",),
    "rank_failed": ("prefill",),
    "decode_unreachable": ("prefill",),
    "decode_failed": ("decode",),
    "lost": ("prefill", "decode"),
    "timeout": ("prefill", "decode"),
}


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The aborts the router sends for one failed request."""

    #: the P ranks sent ``abort``, by index
    prefill: tuple[int, ...]
    #: whether the decode engine is sent ``abort``
    decode: bool


def give_up(cause: str, *, stage: str, p_ranks: int, rank: int | None = None) -> GiveUp:
    """The aborts for a request failed for ``cause`` in ``stage`` (``prefill``:
    P ranks have it, D does not; ``decode``: D has it), with ``p_ranks`` prefill
    ranks; ``rank`` is the P rank that failed or was lost (``rank_failed``,
    ``lost`` in prefill), None for the decode engine (``lost`` in decode).

    Raises:
        ValueError: an unknown cause, a stage the cause cannot come in, or a
            ``rank`` that does not fit it (local misuse).
    """
    stages = _STAGES.get(cause)
    if stages is None:
        raise ValueError(f"unknown give-up cause {cause!r} (one of {', '.join(CAUSES)})")
    if stage not in stages:
        raise ValueError(f"a request is not failed for {cause!r} in stage {stage!r}")
    names_rank = cause == "rank_failed" or (cause == "lost" and stage == "prefill")
    if names_rank != (rank is not None) or (rank is not None and not 0 <= rank < p_ranks):
        raise ValueError(f"{cause!r} in stage {stage!r} with rank {rank!r} of {p_ranks}")
    if cause == "lost" and stage == "decode":
        return GiveUp((), decode=False)
    return GiveUp(
        tuple(i for i in range(p_ranks) if i != rank),
        decode=cause == "timeout" and stage == "decode",
    )
