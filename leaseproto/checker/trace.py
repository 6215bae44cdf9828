"""Trace validation of real runs: ``leaseproto check-trace FILE...`` (spec §9.1).

Each worker started with ``--trace FILE`` writes JSON lines
(:mod:`leaseproto.adapters.trace_writer`). :func:`check_files` merges the traces of
one run and checks:

* each prefill rank, replayed through a fresh ``LeaseTable`` and the rules
  (:mod:`.trace_rules`): every grant, renewal, release and verdict it logged
  is a legal transition and exactly what the table does (I1-I7, I10, I12,
  I13's verdict rule);
* the network (§3.1: the transport may reorder, delay and lose, never invent):
  every notification a traced agent received from a traced agent was sent by
  it (a ``send``, the transfer-done of a ``read``, or the completion of a push
  ``write``), at most once per send
  and, on one host (the same boot id, so one monotonic clock), not before it
  was sent. Senders without a trace (a test's injector) are counted, not
  checked;
* each decode rank (I13, :mod:`.trace_reads`): it used what it read only after ``OK`` for that
  request from every P agent it read from that gives verdicts -- its trace
  says so, or the agent greeted this rank (``OK:leaseproto/1``): once it
  has, no request makes the rank use its reads unverified (spec §7.4) --
  (with the network check and P's replay, that ``OK`` was sent while the
  lease was live), counted ``OK`` only from agents it read from, and never
  used a read whose lease had ended when P handled its transfer-done --
  which catches a decoder that uses reads unverified (a P that gives no
  verdicts, ``--policy fixed``) where it matters.

Push registrations in a grantor D's trace (pushed-KV uses, quarantines, I15)
are checked by :mod:`.trace_push`.

Every violation names the file and line of the first event no legal
transition explains and the invariant's id.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable
from pathlib import Path

from ..core.errors import LeaseProtocolError
from .trace_events import Event, Violation
from .trace_files import TraceError, TraceFile, load
from .trace_push import check_push_events
from .trace_reads import _decode
from .trace_report import Report
from .trace_rules import PrefillReplay
from .trace_timing import DEFAULT_SLACK, check_timing
from .trace_verdicts import verdict_delays

__all__ = ["Report", "TraceError", "TraceFile", "check_files", "check_traces", "load"]

#: Slack for comparing two processes' readings of one monotonic clock, seconds.
CLOCK_SLACK = 1e-3


def _sends(
    traces: Iterable[TraceFile], report: Report
) -> dict[tuple[str, str, bytes], deque[Event]]:
    out: dict[tuple[str, str, bytes], deque[Event]] = defaultdict(deque)
    for tf in traces:
        for e in tf.events:
            # a send the endpoint reported failed may still have left (a NIXL error after it);
            # a READ's or a push WRITE's completion is delivered by NIXL after it
            if e.ev in ("read", "write", "send"):
                if "to" not in e.obj:
                    report.violations.append(Violation("format", e, f"a {e.ev} event without to"))
                    continue
                out[(tf.agent, str(e.obj["to"]), e.data())].append(e)
    return out


def _network(traces: list[TraceFile], report: Report) -> None:
    """Every received notification from a traced agent was sent by it (§3.1)."""
    by_agent = {tf.agent: tf for tf in traces}
    sends = _sends(traces, report)
    for tf in traces:
        for e in tf.events:
            if e.ev != "recv":
                continue
            if "src" not in e.obj:
                report.violations.append(Violation("format", e, "a recv event without src"))
                continue
            src = str(e.obj["src"])
            sender = by_agent.get(src)
            if sender is None:
                report.external += 1
                continue
            queue = sends.get((src, tf.agent, e.data()))
            if not queue:
                report.violations.append(
                    Violation("§3.1", e, f"received {e.data()!r} from {src}, which never sent it")
                )
                continue
            same_clock = sender.header.get("boot") is not None and sender.header.get(
                "boot"
            ) == tf.header.get("boot")
            sent = queue.popleft()
            if same_clock and sent.t > e.t + CLOCK_SLACK:
                report.violations.append(
                    Violation(
                        "§3.1",
                        e,
                        f"received {e.data()!r} from {src} before it was sent "
                        f"({sent.path}:{sent.line})",
                    )
                )
                continue
            report.matched += 1


def _grantor(tf: TraceFile) -> bool:
    """A trace holding leases in its own table: P's, or any trace with ``grant``
    events (D's cached turns and push registrations, spec §2.8)."""
    return tf.role == "prefill" or any(e.ev == "grant" for e in tf.events)


def check_traces(
    traces: list[TraceFile], *, timing: bool = False, slack: float = DEFAULT_SLACK
) -> Report:
    """Check the traces of one run (see the module's docstring); I8 and I11
    (:mod:`.trace_timing`, with ``slack``) are reported, and are violations only
    with ``timing``.

    Raises:
        TraceError: an event lacks a field its kind has.
    """
    start = time.perf_counter()
    report = Report(files=len(traces), events=sum(len(tf.events) + 1 for tf in traces))
    report.cut = sum(not tf.complete for tf in traces)
    by_agent = {tf.agent: tf for tf in traces}
    replays: dict[str, PrefillReplay] = {}
    for tf in traces:
        report.violations += tf.bad
        if _grantor(tf):
            try:
                replay = replays[tf.agent] = PrefillReplay(tf.header, complete=tf.complete)
            except (LeaseProtocolError, KeyError, TypeError, ValueError) as exc:
                raise TraceError(
                    f"{tf.path}:1: a header whose configuration is bad: {exc}"
                ) from exc
            for e in tf.events:
                replay.feed(e)  # a malformed event is a violation naming its line
            replay.finish()
            report.violations += check_push_events(tf.events)
            report.leases += replay.grants
            report.releases += replay.releases
            report.violations += replay.violations
    for tf in traces:
        if tf.role == "decode" or any(e.ev in ("use", "recompute") for e in tf.events):
            _decode(tf, by_agent, replays, report)
    _network(traces, report)
    report.timing = check_timing(traces, slack=slack)
    report.verdicts = verdict_delays(traces)
    if timing:
        report.violations += report.timing.findings
    report.seconds = time.perf_counter() - start
    return report


def check_files(
    paths: Iterable[str | Path], *, timing: bool = False, slack: float = DEFAULT_SLACK
) -> Report:
    """Load and check the traces at ``paths`` (``timing``, ``slack``: :func:`check_traces`).

    Raises:
        OSError: a file cannot be read.
        TraceError: a file is not a trace.
    """
    start = time.perf_counter()
    report = check_traces([load(p) for p in paths], timing=timing, slack=slack)
    report.seconds = time.perf_counter() - start
    return report
