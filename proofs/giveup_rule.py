"""Lemma L20: the router's give-up rule is spec §2.1's, the half of I17 that is a
table.

``leaseproto.workers.giveup.give_up`` (which the router calls and the model
checker's ``giveup`` scope runs) is run on every input of a bounded set: each
cause, each stage, no rank or each rank of up to six P ranks and one out of
range on either side. It is compared with spec §2.1 as written here, not taken
from the code: a request the router fails is aborted on every P rank but one it
cannot reach (lost) or that holds none (its prefill failed); on none when D's
connection was lost (D may still be reading: the leases lapse, I5/I6); on D
only when D has the request and did not answer (the deadline passed in the
decode stage). A cause that cannot come in a stage, or a rank that does not fit
the cause, is local misuse (``ValueError``). The model checker then shows the
aborts, delivered, leave nothing held (I17, scope ``giveup``).
"""

from __future__ import annotations

from typing import Any

import z3

from leaseproto.workers import giveup

from .loops import Check, built

SYSTEM = "giveup"

#: spec §2.1: the stages each cause comes in, and whether it names a P rank there
_ROWS = {
    ("unsent", "prefill"): False,
    ("rank_failed", "prefill"): True,
    ("lost", "prefill"): True,
    ("decode_unreachable", "prefill"): False,
    ("decode_failed", "decode"): False,
    ("lost", "decode"): False,
    ("timeout", "prefill"): False,
    ("timeout", "decode"): False,
}
_CAUSES = ("unsent", "rank_failed", "lost", "decode_unreachable", "decode_failed", "timeout", "x")
_STAGES = ("prefill", "decode", "")


def _spec(cause: str, stage: str, p_ranks: int, rank: int | None) -> tuple[set[int], bool] | None:
    """Whom spec §2.1 has the router tell (P ranks, D), or None for misuse."""
    names = _ROWS.get((cause, stage))
    if names is None or names != (rank is not None):
        return None
    if rank is not None and not 0 <= rank < p_ranks:
        return None
    if cause == "lost" and stage == "decode":  # D lost: nobody; the leases lapse
        return set(), False
    return set(range(p_ranks)) - {rank}, cause == "timeout" and stage == "decode"


def _runs() -> Check:
    bad: list[tuple[str, Any]] = []
    for p_ranks in range(1, 7):
        for cause in _CAUSES:
            for stage in _STAGES:
                for rank in (None, -1, *range(p_ranks + 1)):
                    case = f"{cause} in {stage or '-'} with rank {rank} of {p_ranks}"
                    want = _spec(cause, stage, p_ranks, rank)
                    try:
                        out = giveup.give_up(cause, stage=stage, p_ranks=p_ranks, rank=rank)
                    except ValueError:
                        if want is not None:
                            bad.append((f"{case}: refused", z3.BoolVal(True)))
                        continue
                    got = (set(out.prefill), out.decode)
                    if want is None:
                        bad.append((f"{case}: accepted", z3.BoolVal(True)))
                    elif got != want or len(out.prefill) != len(set(out.prefill)):
                        bad.append((f"{case}: told {got}, the spec {want}", z3.BoolVal(True)))
    return Check([], bad)


def checks(only: str = "") -> list[tuple[str, Check]]:
    label = "L20 the router's give-up rule = spec §2.1 (I17)"
    return [(label, built(label, _runs))] if only in label else []
