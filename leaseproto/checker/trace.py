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
* each decode rank (I13): it used what it read only after ``OK`` for that
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

import json
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import wire
from ..core.errors import LeaseProtocolError
from ..core.rules import GRANTED
from ..core.state import LeaseState
from .trace_push import check_push_events, push_use
from .trace_rules import Event, PrefillReplay, Violation
from .trace_timing import DEFAULT_SLACK, Timing, check_timing
from .trace_verdicts import Verdicts, verdict_delays

__all__ = ["Report", "TraceError", "TraceFile", "check_files", "check_traces", "load"]

#: Slack for comparing two processes' readings of one monotonic clock, seconds.
CLOCK_SLACK = 1e-3


class TraceError(ValueError):
    """A file that is not a trace (no header, a line that is not JSON)."""


@dataclass
class TraceFile:
    """One worker's trace: its header, its events in order, and whether it
    ended cleanly (an ``end`` line; a killed worker's trace has none)."""

    path: str
    header: dict[str, Any]
    events: list[Event]
    complete: bool
    #: lines that are not events (not JSON, not an object with ``ev``), as violations
    bad: list[Violation] = field(default_factory=list)

    @property
    def agent(self) -> str:
        return str(self.header.get("agent", ""))

    @property
    def role(self) -> str:
        return str(self.header.get("role", ""))


@dataclass
class Report:
    """What :func:`check_files` found."""

    files: int = 0
    events: int = 0
    leases: int = 0
    releases: int = 0
    matched: int = 0
    external: int = 0
    uses: int = 0
    recomputes: int = 0
    prefix_uses: int = 0
    push_uses: int = 0
    cut: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    #: I8 and I11 (:mod:`.trace_timing`): violations only with ``timing=True``
    timing: Timing = field(default_factory=Timing)
    #: how long verified reads waited for their verdicts (:mod:`.trace_verdicts`)
    verdicts: Verdicts = field(default_factory=Verdicts)

    @property
    def ok(self) -> bool:
        return not self.violations

    def first(self) -> Violation | None:
        """The earliest violation (by the monotonic clock, then file order)."""
        return min(
            self.violations, key=lambda v: (v.event.t, v.event.path, v.event.line), default=None
        )

    def summary(self) -> str:
        status = "ok" if self.ok else f"{len(self.violations)} violation(s)"
        return (
            f"check-trace: {status}: {self.events} events in {self.files} files "
            f"({self.cut} cut short), {self.leases} leases granted, {self.releases} released, "
            f"{self.matched} notifications matched to their sends ({self.external} from "
            f"untraced agents), {self.uses} reads used ({self.prefix_uses} turn-2 prefixes, "
            f"I14; {self.push_uses} pushed KV, I15), {self.recomputes} prefixes recomputed; "
            f"{self.seconds:.3f} s\n"
            f"{self.timing.summary()}\n"
            f"{self.verdicts.summary()}"
        )

    def as_dict(self) -> dict[str, Any]:
        first = self.first()
        return {
            "ok": self.ok,
            "files": self.files,
            "events": self.events,
            "cut": self.cut,
            "leases": self.leases,
            "releases": self.releases,
            "matched": self.matched,
            "external": self.external,
            "uses": self.uses,
            "prefix_uses": self.prefix_uses,
            "push_uses": self.push_uses,
            "recomputes": self.recomputes,
            "timing": self.timing.as_dict(),
            "verdicts": self.verdicts.as_dict(),
            "seconds": self.seconds,
            "violations": len(self.violations),
            "by_invariant": dict(Counter(v.invariant for v in self.violations)),
            "first": None if first is None else str(first),
            "invariant": None if first is None else first.invariant,
        }


def load(path: str | Path) -> TraceFile:
    """Read one trace. A last line cut off mid-write (a killed worker) is dropped;
    any other line that is not an event is kept as a ``format`` violation naming
    it (:attr:`TraceFile.bad`).

    Raises:
        OSError: it cannot be read.
        TraceError: it is not a trace (its first line is not a trace header).
    """
    name = str(path)
    raw = Path(path).read_text(encoding="ascii", errors="replace")
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # no newline after it: written only in part
    events: list[Event] = []
    bad: list[Violation] = []
    for i, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == 1:
                raise TraceError(f"{name}:{i}: not JSON: {exc}") from exc
            bad.append(Violation("format", Event(name, i, {}), f"not JSON: {exc}"))
            continue
        if not isinstance(obj, dict) or "ev" not in obj:
            if i == 1:
                raise TraceError(f"{name}:{i}: not a trace event")
            bad.append(Violation("format", Event(name, i, {}), "not a trace event"))
            continue
        if "data" in obj and not _latin1(obj["data"]):  # the writer's bytes, one char each
            why = f"data is not a string of bytes (latin-1): {obj['data']!r:.80}"
            bad.append(Violation("format", Event(name, i, {}), why))
            continue
        events.append(Event(name, i, obj))
    if not events or events[0].ev != "header" or events[0].line != 1:
        raise TraceError(f"{name}: no trace header (is it a --trace file?)")
    header = events[0].obj
    complete = events[-1].ev == "end"
    return TraceFile(name, header, events[1:], complete, bad)


def _latin1(data: object) -> bool:
    """Whether ``data`` is what a trace writes for bytes: a string of code points
    below 256 (:meth:`~.trace_rules.Event.data` encodes it back)."""
    if not isinstance(data, str):
        return False
    try:
        data.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


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


def _verifying(tf: TraceFile | None) -> bool:
    """Whether a P agent's trace says it answers transfer-dones with verdicts."""
    return tf is not None and tf.header.get("policy", "lease") == "lease"


def _ended_read(
    tf: TraceFile, remote: str, sources: set[str], replays: dict[str, PrefillReplay]
) -> str | None:
    """A P agent of ``sources`` whose lease of ``remote`` had ended when it
    handled this rank's transfer-done, and how (I13's first half), or None."""
    for a in sorted(sources):
        replay = replays.get(a)
        state = None if replay is None else replay.read_state.get((tf.agent, remote))
        if state is not None and state != GRANTED:
            return f"{a} ({LeaseState(state).name})"
    return None


def _grantor(tf: TraceFile) -> bool:
    """A trace holding leases in its own table: P's, or any trace with ``grant``
    events (D's cached turns and push registrations, spec §2.8)."""
    return tf.role == "prefill" or any(e.ev == "grant" for e in tf.events)


#: the invariant a reader's ``use`` of each kind is checked against (spec §2.8)
USE_KINDS = {"decode": "I13", "prefix": "I14", "push": "I15"}
RECOMPUTE_REASONS = frozenset({"nack", "timeout", "lost", "gate"})


def _decode(
    tf: TraceFile,
    by_agent: dict[str, TraceFile],
    replays: dict[str, PrefillReplay],
    report: Report,
) -> None:
    """I13 on one decode rank: a read is used only after every OK it waits for,
    and never when its lease had ended as P handled its transfer-done."""
    read_from: dict[str, set[str]] = defaultdict(set)
    oks: set[tuple[str, str]] = set()
    greeted: set[str] = set()  # P agents that answered this rank's hello
    verify = bool(tf.header.get("verify_reads", True)) and tf.header.get("policy") == "lease"
    for e in tf.events:
        if e.ev == "read":
            try:
                done = wire.decode(e.data())
            except wire.MalformedMessage:
                continue
            if isinstance(done, wire.TransferDone):
                read_from[done.req_id].add(str(e.obj.get("to")))
        elif e.ev == "recv":
            try:
                msg = wire.decode(e.data())
            except wire.MalformedMessage:
                continue
            if isinstance(msg, wire.Ok) and msg.req_id == wire.CAPABILITY:
                greeted.add(str(e.obj.get("src")))
            elif isinstance(msg, wire.Ok):
                oks.add((str(e.obj.get("src")), msg.req_id))
        elif e.ev == "recompute":
            report.recomputes += 1
            if "req" not in e.obj or e.obj.get("reason") not in RECOMPUTE_REASONS:
                report.violations.append(
                    Violation(
                        "format",
                        e,
                        f"a recompute event without req or a reason in {sorted(RECOMPUTE_REASONS)}",
                    )
                )
        elif e.ev == "use":
            report.uses += 1
            remote = str(e.obj.get("remote"))
            inv = USE_KINDS.get(str(e.obj.get("kind", "decode")))
            if inv is None:
                report.violations.append(
                    Violation("format", e, f"a use of kind {e.obj.get('kind')!r}")
                )
                continue
            report.prefix_uses += inv == "I14"
            if inv == "I15":
                report.push_uses += 1
                if (bad := push_use(tf.events, e, remote, replays.get(tf.agent))) is not None:
                    report.violations.append(Violation(inv, e, bad))
                continue
            got = e.obj.get("ok_from", [])
            if not isinstance(got, list):
                report.violations.append(
                    Violation("format", e, "a use event whose ok_from is not a list")
                )
                continue
            ok_from = {str(a) for a in got}
            sources = read_from.get(remote, set())
            missing = sorted(a for a in ok_from if (a, remote) not in oks)
            if missing:
                report.violations.append(
                    Violation(inv, e, f"used the read of {remote} before OK from {missing[0]}")
                )
            elif not sources:
                report.violations.append(Violation(inv, e, f"used {remote}, never read"))
            elif ok_from - sources:
                report.violations.append(
                    Violation(
                        inv,
                        e,
                        f"used the read of {remote} on an OK from {sorted(ok_from - sources)[0]}, "
                        "which it did not read it from",
                    )
                )
            elif (ended := _ended_read(tf, remote, sources, replays)) is not None:
                report.violations.append(
                    Violation(
                        inv,
                        e,
                        f"used the read of {remote}, whose lease had ended when "
                        f"{'D' if inv == 'I14' else 'P'} handled its transfer-done: {ended}",
                    )
                )
            else:
                unverified = sorted(
                    a
                    for a in sources - ok_from
                    if verify and (a in greeted or _verifying(by_agent.get(a)))
                )
                if unverified:
                    report.violations.append(
                        Violation(
                            inv,
                            e,
                            f"used the read of {remote} from {unverified[0]}, which gives "
                            "verdicts, without waiting for its OK",
                        )
                    )


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
