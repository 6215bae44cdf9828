"""The reader's read of a grantor's blocks in a replay (spec §2.8, §8.7, §12.1):
``gate`` asks the real :class:`~leaseproto.ClockOffset` gate (I9) whether to
read, ``use`` says what the reader does with what it read (I13/I14).

``gate`` converts the deadline the grantor exported at the grant by an offset
sample (``sampled_at``, round trip ``rtt``: ``t0`` and ``t1`` on the reader's
clock, the grantor's reading at the middle), aged by ``rho``. ``use`` looks at
the READ's completion (the instant the reader sent its transfer-done: NIXL
delivers it only then). Without ``verify`` (vLLM's gate-only design) the read
is used as it is: ``stale`` when the grantor had freed the lease by then (the
blocks may hold another request's KV), else ``used``. With ``verify`` the
grantor's verdict on that transfer-done decides: ``used`` on ``OK`` from every
rank, ``recomputed`` on an ``NK``, ``waiting`` before any verdict.
"""

from __future__ import annotations

from typing import Any

from ..core.clock import DEFAULT_CLOCK_DRIFT, ClockOffset
from .format import Op, ScenarioError
from .replay_state import Rank, World, fmt

__all__ = ["Reads"]


class Reads(World):
    """``gate`` and ``use`` lines (the reader side of a read)."""

    def _granted(self, op: Op) -> list[Rank]:
        ranks = self._select(op.args["engine"], None)
        if not all(op.args["id"] in r.exported for r in ranks):
            raise ScenarioError(op.line, f"{op.op}: {self.G} never granted {op.args['id']!r}")
        return ranks

    def _op_gate(self, op: Op) -> None:
        a = op.args
        rid = a["id"]
        deadline = min(r.exported[rid] for r in self._granted(op))
        rtt = a.get("rtt", 0.0)
        at = a.get("sampled_at", self.t - rtt)
        clock = ClockOffset(rho=a.get("rho", DEFAULT_CLOCK_DRIFT))
        clock.add_sample(
            t0=self._now(self.R, at),
            remote_time=self._now(self.G, at + rtt / 2),
            t1=self._now(self.R, at + rtt),
        )
        now = self._now(self.R)
        margin = a.get("margin", self.cfg.safety_margin)
        admits = clock.read_allowed(deadline, now=now, margin=margin)
        self._emit(
            self.R,
            "gate",
            f"gate {rid}: {self.G}'s deadline {fmt(deadline)} is {fmt(clock.to_local(deadline))} "
            f"on {self.R}'s clock (offset {fmt(clock.offset)} +- "
            f"{clock.uncertainty_at(now):.3f}); now {fmt(now)} + margin {margin:g}: "
            + ("admits the read" if admits else f"refuses it ({self.R} recomputes the prefix)"),
            id=rid,
            admits=admits,
        )

    def _op_use(self, op: Op) -> None:
        a = op.args
        rid = a["id"]
        ranks = self._granted(op)
        done = self.read_done.get(rid)
        if done is None:
            raise ScenarioError(op.line, f"use: {rid!r} was never read (no transfer_done sent)")
        data: dict[str, Any] = {"id": rid, "verify": a["verify"]}
        if not a["verify"]:
            freed = [r.freed_t[rid] for r in ranks if rid in r.freed_t]
            if freed and min(freed) <= done:
                outcome = "stale"
                text = (
                    f"{self.R} uses the read of {rid} as read (no verdict): {self.G} freed it at "
                    f"{fmt(min(freed))}, before the READ completed at {fmt(done)}; the blocks "
                    "may hold another request's KV: WRONG (I14 broken)"
                )
            else:
                outcome = "used"
                text = f"{self.R} uses the read of {rid} as read (no verdict): still held then"
        else:
            answers = [r.verdicts.get(rid) for r in ranks]
            nk = next((v for v in answers if v is not None and not v.startswith("OK:")), None)
            if nk is not None:
                outcome = "recomputed"
                text = (
                    f"{self.R} discards the read of {rid} on {self.G}'s {nk} and recomputes "
                    "the prefix (I14 holds)"
                )
            elif None in answers:
                outcome = "waiting"
                text = f"{self.R} waits for {self.G}'s verdict on {rid}"
            else:
                outcome = "used"
                text = f"{self.R} uses the read of {rid}: OK from every {self.G} rank"
        self.uses.setdefault(rid, []).append(outcome)
        self._emit(self.R, "use", text, outcome=outcome, **data)
