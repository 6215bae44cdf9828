"""The reads each decode rank used, checked against its verdicts (I13; I14 and I15
for a ``use`` of kind ``prefix`` or ``push``; trace validation, spec §9.1).
"""

from __future__ import annotations

from collections import defaultdict

from ..core import wire
from ..core.rules import GRANTED
from ..core.state import LeaseState
from .trace_events import Violation
from .trace_files import TraceFile
from .trace_push import push_use
from .trace_report import Report
from .trace_rules import PrefillReplay

__all__ = ["RECOMPUTE_REASONS", "USE_KINDS"]


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
