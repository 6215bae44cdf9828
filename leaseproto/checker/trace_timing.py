"""The timing invariants of one real run, from its traces (``check-trace``, spec §9.1).

* **I11** (D's schedule): consecutive heartbeats a decode rank sent to a P agent
  naming one request (so D tracked it all along) are at most
  ``heartbeat_interval + slack`` apart, on D's clock;
* **I8** (no expiry of a lease D still tracks): every ``EXPIRED`` release on P of
  a request a decode rank went on heartbeating to that P after the release is
  explained only when the run broke §5.3's T2 there: the gap between the last
  heartbeat P could have handled before the expiry and the next one, plus the
  run's own longest measured delay from a heartbeat's send to P handling it,
  plus ``slack``, reaches ``lease_extension``. An expiry with T2 kept is
  unexplained.

A loaded host, a paused or killed worker (the e2e tests pause and kill them on
purpose) break §5's assumptions legitimately, so these findings are reported
beside the check and fail it only when asked (``check-trace --timing``).
Times of two traces are compared only when both share a monotonic clock (the
same boot id).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core import wire
from ..core.config import LeaseConfig
from ..core.errors import LeaseProtocolError
from .trace_events import Event, Violation
from .trace_files import TraceFile

__all__ = ["DEFAULT_SLACK", "Timing", "check_timing"]

#: Stated slack for the timing checks, seconds (a loop turn and the clock readings).
DEFAULT_SLACK = 0.05


@dataclass
class Timing:
    """What the timing checks measured and found."""

    slack: float = DEFAULT_SLACK
    #: heartbeat intervals checked (I11), and the longest, seconds
    intervals: int = 0
    longest: float = 0.0
    #: the run's longest measured delay from a heartbeat's send to P handling it
    delay: float = 0.0
    #: EXPIRED releases of requests D went on heartbeating (I8), and how many of
    #: them a broken T2 explains
    tracked_expiries: int = 0
    explained: int = 0
    findings: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"timing: {self.intervals} heartbeat intervals (longest {self.longest:.3f} s), "
            f"longest send-to-handle delay {self.delay:.3f} s, {self.tracked_expiries} expiries "
            f"of leases D still heartbeated ({self.explained} where T2 was broken), "
            f"{len(self.findings)} finding(s) of I8/I11 (slack {self.slack} s)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "slack": self.slack,
            "intervals": self.intervals,
            "longest": self.longest,
            "delay": self.delay,
            "tracked_expiries": self.tracked_expiries,
            "explained": self.explained,
            "findings": len(self.findings),
        }


def _ids(e: Event) -> tuple[str, ...]:
    data = e.data()
    if not data.startswith(wire.HEARTBEAT_PREFIX):
        return ()
    try:
        msg = wire.decode(data)
    except wire.MalformedMessage:
        return ()
    return tuple(i for i in getattr(msg, "ids", ()) if i != wire.CAPABILITY)


def trace_config(tf: TraceFile) -> LeaseConfig | None:
    """The configuration a trace's header records, or None when it is not one (the
    replay reports that)."""
    try:
        return LeaseConfig.from_extra_config(tf.header.get("config", {}))
    except (LeaseProtocolError, KeyError, TypeError, ValueError):  # the replay reports it
        return None


def _same_clock(a: TraceFile, b: TraceFile) -> bool:
    boot = a.header.get("boot")
    return boot is not None and boot == b.header.get("boot")


def check_timing(traces: Sequence[TraceFile], *, slack: float = DEFAULT_SLACK) -> Timing:
    """I8 and I11 over the traces of one run (see the module's docstring)."""
    out = Timing(slack=slack)
    by_agent = {tf.agent: tf for tf in traces}
    # D's heartbeats: (d, p) -> [(t, ids, event)], and (d, p, bytes) -> sends in order
    beats: dict[tuple[str, str], list[tuple[float, tuple[str, ...], Event]]] = defaultdict(list)
    pending: dict[tuple[str, str, bytes], deque[Event]] = defaultdict(deque)
    for tf in traces:
        if tf.role != "decode":
            continue
        for e in tf.events:
            if e.ev == "send" and (ids := _ids(e)):
                to = str(e.obj.get("to"))
                beats[(tf.agent, to)].append((e.t, ids, e))
                pending[(tf.agent, to, e.data())].append(e)
    # the measured delay: each heartbeat's send to P's handling of it (one clock)
    handled: dict[int, float] = {}  # id(send event) -> when P handled it
    for tf in traces:
        if tf.role != "prefill":
            continue
        for e in tf.events:
            if e.ev != "handle":
                continue
            src = str(e.obj.get("src"))
            queue = pending.get((src, tf.agent, e.data()))
            sender = by_agent.get(src)
            if queue and sender is not None and _same_clock(sender, tf):
                send = queue.popleft()
                handled[id(send)] = e.t
                out.delay = max(out.delay, e.t - send.t)
    for (d, p), sent in beats.items():
        ptf = by_agent.get(p)
        cfg = None if ptf is None else trace_config(ptf)
        if cfg is None:
            continue
        _schedule(out, d, p, sent, cfg.heartbeat_interval)
    for tf in traces:
        cfg = trace_config(tf) if tf.role == "prefill" else None
        if cfg is not None:
            _expiries(out, tf, by_agent, beats, handled, cfg.lease_extension)
    return out


def _schedule(
    out: Timing, d: str, p: str, sent: list[tuple[float, tuple[str, ...], Event]], h: float
) -> None:
    """I11: heartbeats naming a request D tracked all along, at most H + slack apart."""
    last: dict[str, float] = {}
    for t, ids, e in sent:
        gaps = [t - last[r] for r in ids if r in last]
        for r in ids:
            last[r] = t
        if not gaps:
            continue
        gap = max(gaps)  # one interval of the engine's schedule
        out.intervals += 1
        out.longest = max(out.longest, gap)
        if gap > h + out.slack:
            out.findings.append(
                Violation(
                    "I11",
                    e,
                    f"{d} sent {p} a heartbeat {gap:.3f} s after the previous one naming the "
                    f"same request (H = {h} s, slack {out.slack} s)",
                )
            )


def _expiries(  # noqa: PLR0917  (one P trace against D's heartbeats)
    out: Timing,
    tf: TraceFile,
    by_agent: dict[str, TraceFile],
    beats: dict[tuple[str, str], list[tuple[float, tuple[str, ...], Event]]],
    handled: dict[int, float],
    ext: float,
) -> None:
    """I8: each expiry of a request some D went on heartbeating to this P."""
    for e in tf.events:
        if e.ev != "release" or e.obj.get("reason") != "expired":
            continue
        r, at = str(e.obj.get("req")), e.t
        for (d, p), sent in beats.items():
            dtf = by_agent.get(d)
            if p != tf.agent or dtf is None or not _same_clock(dtf, tf):
                continue
            naming = [(t, ev) for t, ids, ev in sent if r in ids]
            before = [(t, ev) for t, ev in naming if handled.get(id(ev), t) <= at]
            after = [t for t, _ in naming if t > at]
            if not after or not before:
                continue  # D had stopped tracking it, or never heartbeated it in time
            out.tracked_expiries += 1
            gap = after[0] - before[-1][0]
            if gap + out.delay + out.slack >= ext:
                out.explained += 1
                continue
            out.findings.append(
                Violation(
                    "I8",
                    e,
                    f"{r} expired at {at:.3f} while {d} heartbeated it: its heartbeats were "
                    f"{gap:.3f} s apart around the expiry and the run's longest send-to-handle "
                    f"delay is {out.delay:.3f} s, which keeps T2 (E = {ext} s, slack "
                    f"{out.slack} s)",
                )
            )
