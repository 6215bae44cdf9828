"""What ``leaseproto check-trace`` found in one run's traces (spec §9.1): the
counts, the violations and the measurements (:func:`.trace.check_traces` fills it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .trace_events import Violation
from .trace_timing import Timing
from .trace_verdicts import Verdicts

__all__ = ["Report"]


@dataclass
class Report:
    """What :func:`.trace.check_files` found."""

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
