"""Breadth-first search over the world's states (TLC's algorithm, on real objects).

Each state is a :class:`~.world.World`; a successor is a copy with one action
applied. States are deduplicated by :func:`~.fingerprint.world_fingerprint`.
Breadth-first order makes the first violation found one with the fewest steps;
its trace is rebuilt from parent links. A state in which nothing can happen,
not even time passing, is reported too (a modelling error, or a real deadlock).

A run ends in one of four verdicts (:attr:`Result.verdict`): ``ok``;
``violation``, an invariant failed (wrong behaviour, named by its spec id;
a deadlock counts here); ``misuse``, the core refused a call the world made
(a :class:`~leaseproto.core.errors.LeaseProtocolError`: the glue misused the
core, or the core rejects legal input); ``crash``, any other exception raised
while a step ran (a bug that fails loudly, not wrong behaviour). The mutation
run (``tools/mutation_run.py``) counts them apart.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from ..core.errors import LeaseProtocolError
from .push_world import make_world
from .scope import Scope
from .world import Violation

__all__ = ["CRASH", "MISUSE", "OK", "VERDICTS", "VIOLATION", "Result", "check"]

OK, VIOLATION, MISUSE, CRASH = "ok", "violation", "misuse", "crash"
#: every verdict of a run, wrong behaviour first
VERDICTS = (OK, VIOLATION, MISUSE, CRASH)


@dataclass
class Result:
    scope: Scope
    states: int = 0
    transitions: int = 0
    depth: int = 0
    seconds: float = 0.0
    #: the search stopped at ``scope.max_states`` before exhausting the space
    bounded: bool = False
    #: transitions taken, by action name (``grant``, ``p_restart``, ``arrive``...): a
    #: fault the scope allows but no transition took was not explored
    taken: Counter[str] = field(default_factory=Counter)
    violation: Violation | None = None
    trace: list[str] = field(default_factory=list)

    #: how the run ended: one of :data:`VERDICTS`
    verdict: str = OK

    @property
    def ok(self) -> bool:
        return self.violation is None

    def summary(self) -> str:
        head = (
            f"scope {self.scope.name}: {self.states} distinct states, "
            f"{self.transitions} transitions, depth {self.depth}, {self.seconds:.1f} s"
        )
        if self.bounded:
            head += f" (stopped at max_states={self.scope.max_states})"
        if self.violation is None:
            return head + ": no violation"
        steps = "\n".join(f"  {i + 1:2d}. {s}" for i, s in enumerate(self.trace))
        what = {VIOLATION: "VIOLATION of", MISUSE: "MISUSE:", CRASH: "CRASH:"}[self.verdict]
        return (
            f"{head}\n{what} {self.violation.inv}: {self.violation.text}\n"
            f"shortest trace ({len(self.trace)} steps):\n{steps}"
        )


def _crash(exc: Exception) -> Violation:
    """A crash, named by the exception and the innermost frame it came from."""
    tb = exc.__traceback__
    where = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        where = f" at {code.co_filename.rsplit('/', 2)[-1]}:{tb.tb_lineno} ({code.co_name})"
        tb = tb.tb_next
    return Violation("crash", f"{type(exc).__name__}: {exc}{where}")


def check(scope: Scope) -> Result:
    """Explore every state of ``scope`` (up to ``max_states``)."""
    start = time.perf_counter()
    res = Result(scope)
    root = make_world(scope)
    fp0 = root.fingerprint()
    parent: dict[bytes, tuple[bytes, str] | None] = {fp0: None}
    depth = {fp0: 0}
    frontier = deque([(fp0, root)])

    def trace(fp: bytes) -> list[str]:
        out: list[str] = []
        link = parent[fp]
        while link is not None:
            fp, label = link
            out.append(label)
            link = parent[fp]
        return out[::-1]

    def stop(verdict: str, v: Violation, steps: list[str]) -> None:
        res.verdict, res.violation, res.trace = verdict, v, steps

    while frontier:
        fp, w = frontier.popleft()
        try:
            acts = w.actions()
        except Exception as exc:
            stop(CRASH, _crash(exc), trace(fp))
            break
        if not acts:
            stop(VIOLATION, Violation("deadlock", "nothing can happen, not even a tick"), trace(fp))
            break
        for act in acts:
            label = w.label(act)
            res.transitions += 1
            res.taken[act[0]] += 1
            try:
                w2 = w.copy()
                w2.apply(act)
                f2 = w2.fingerprint()
            except Violation as v:
                stop(VIOLATION, v, [*trace(fp), label])
                break
            except LeaseProtocolError as exc:  # the glue misused the core, or the core is wrong
                stop(
                    MISUSE, Violation("misuse", f"{type(exc).__name__}: {exc}"), [*trace(fp), label]
                )
                break
            except Exception as exc:
                stop(CRASH, _crash(exc), [*trace(fp), label])
                break
            if f2 in parent:
                continue
            parent[f2] = (fp, label)
            depth[f2] = depth[fp] + 1
            res.depth = max(res.depth, depth[f2])
            if len(parent) >= scope.max_states:
                res.bounded = True
                frontier.clear()
                break
            frontier.append((f2, w2))
        if res.violation is not None:
            break
    res.states = len(parent)
    res.seconds = time.perf_counter() - start
    return res
