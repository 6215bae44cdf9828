"""How long each verified read waited for its verdict, from the traces of one run
(``check-trace``; measured, never a violation).

For each READ a decode rank made (``read``: its transfer-done ``<id>:<n>`` to a P
agent), on one monotonic clock (traces of one boot):

* **to P's poll**: the ``read`` to P's ``recv`` of that transfer-done (the READ
  itself, then how long P took to poll it);
* **P's answer**: that ``recv`` to P's ``send`` of ``OK:<id>``/``NK:...:<id>`` to
  the reader (P answers in the poll that returned the transfer-done when this is
  a few microseconds: the answer is sent from the same loop over the poll);
* **to D's poll**: P's ``send`` to D's ``recv`` of the verdict;
* **to the release**: D's ``recv`` of the verdict to the read's ``use`` (the
  read's tokens may go out);
* **READ to use**: the whole, from the ``read`` to ``use``.

A read with no verdict received is *unanswered*; one whose verdict came more
than ``bound`` after P's ``recv`` of its transfer-done is *late*.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import wire
from .trace_events import Event
from .trace_files import TraceFile
from .trace_timing import trace_config

__all__ = ["Verdicts", "verdict_delays"]

SEGMENTS = ("to_p_poll", "p_answer", "to_d_poll", "to_release", "read_to_use")


@dataclass
class Verdicts:
    """Delays of the verdict path, seconds, one list per segment (see the module)."""

    delays: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SEGMENTS})
    reads: int = 0
    unanswered: list[str] = field(default_factory=list)  # "<req> from <agent>"
    late: list[str] = field(default_factory=list)  # "<req> from <agent>: <s>"

    def stats(self, segment: str) -> tuple[float, float] | None:
        xs = self.delays[segment]
        return None if not xs else (statistics.median(xs), max(xs))

    def summary(self) -> str:
        if not self.reads:
            return "verdicts: no verified read"
        parts = []
        for s in SEGMENTS:
            got = self.stats(s)
            if got is not None:
                parts.append(f"{s} {1e3 * got[0]:.2f}/{1e3 * got[1]:.2f}")
        return (
            f"verdicts: {self.reads} reads, ms median/max: {', '.join(parts)}; "
            f"{len(self.unanswered)} unanswered, {len(self.late)} late"
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reads": self.reads, "unanswered": self.unanswered}
        out["late"] = self.late
        for s in SEGMENTS:
            got = self.stats(s)
            out[s] = None if got is None else {"median": got[0], "max": got[1]}
        return out


def _first_after(times: list[float], t: float) -> float | None:
    """The first of ``times`` (sorted) at or after ``t``."""
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


def _bound(traces: Sequence[TraceFile]) -> float | None:
    """How long a decode rank waits for a verdict (its ``lease_extension``)."""
    for tf in traces:
        if tf.role == "decode":
            cfg = trace_config(tf)
            return None if cfg is None else cfg.lease_extension
    return None


def verdict_delays(traces: Sequence[TraceFile], *, bound: float | None = None) -> Verdicts:
    """The verdict path of every READ in ``traces`` (see the module's docstring);
    ``bound``: what makes a verdict late (default: a decode rank's ``lease_extension``)."""
    out = Verdicts()
    if bound is None:
        bound = _bound(traces)
    boot = traces[0].header.get("boot") if traces else None
    if boot is None or any(tf.header.get("boot") != boot for tf in traces):
        return out  # no shared clock: nothing to measure (compared, never hashed: any JSON)
    # (sender, receiver, bytes) -> times, from P's recvs and sends, D's recvs
    p_recv: dict[tuple[str, str, bytes], list[float]] = defaultdict(list)
    sent: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (p, d, req) -> sends
    d_recv: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # (p, d, req) -> recvs
    uses: dict[tuple[str, str], float] = {}  # (d agent, remote id) -> first use
    reads: list[tuple[str, str, str, Event]] = []  # (d, p, req, read event)
    for tf in traces:
        for e in tf.events:
            if tf.role == "prefill" and e.ev == "recv":
                p_recv[(str(e.obj.get("src")), tf.agent, e.data())].append(e.t)
                continue
            if e.ev in ("send", "recv"):
                try:
                    msg = wire.decode(e.data())
                except wire.MalformedMessage:
                    continue
                if not isinstance(msg, (wire.Ok, wire.Nack)) or msg.req_id == wire.CAPABILITY:
                    continue
                if tf.role == "prefill" and e.ev == "send":
                    sent[(tf.agent, str(e.obj.get("to")), msg.req_id)].append(e.t)
                elif tf.role == "decode" and e.ev == "recv":
                    d_recv[(str(e.obj.get("src")), tf.agent, msg.req_id)].append(e.t)
            elif tf.role == "decode" and e.ev == "read":
                try:
                    done = wire.decode(e.data())
                except wire.MalformedMessage:
                    continue
                if isinstance(done, wire.TransferDone):
                    reads.append((tf.agent, str(e.obj.get("to")), done.req_id, e))
            elif tf.role == "decode" and e.ev == "use":
                uses.setdefault((tf.agent, str(e.obj.get("remote"))), e.t)
    for times in (*p_recv.values(), *sent.values(), *d_recv.values()):
        times.sort()  # one agent's events may come from several files
    for d, p, req, e in reads:
        got = _first_after(p_recv.get((d, p, e.data()), []), e.t)
        answer = None if got is None else _first_after(sent.get((p, d, req), []), got)
        heard = None if answer is None else _first_after(d_recv.get((p, d, req), []), answer)
        if got is None or answer is None or heard is None:
            out.unanswered.append(f"{req} from {p}")
            continue
        out.reads += 1
        out.delays["to_p_poll"].append(got - e.t)
        out.delays["p_answer"].append(answer - got)
        out.delays["to_d_poll"].append(heard - answer)
        if bound is not None and heard - got > bound:
            out.late.append(f"{req} from {p}: {heard - got:.3f} s")
        use = uses.get((d, req))
        if use is not None and use >= heard:
            out.delays["to_release"].append(use - heard)
            out.delays["read_to_use"].append(use - e.t)
    return out
