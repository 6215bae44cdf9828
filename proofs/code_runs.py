"""The obligations that run the core's own code (lemmas L14-L18): each module's checks
turned into obligations of ``leaseproto prove``. A check that raised (the code under
proof did what no path of its input can make it do) is an obligation that fails as a
crash, which the mutation run counts apart from a failed one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from . import clock_gate, codec, giveup_rule, loops, settings, structures, tracking
from .obligation import Obligation


@dataclass(frozen=True)
class CodeRun:
    """One module's checks of the core's own code, as ``leaseproto prove`` runs them:
    its ``system``, the invariant and lemma ``ids`` each of its obligations names (so
    :func:`.check.all_obligations` knows, without building them, whether ``--only``
    can keep any), and what builds its checks."""

    system: str
    ids: tuple[str, ...]
    checks: Callable[[str], list[tuple[str, Any]]]
    code: str
    oracle: str

    def obligations(self, only: str = "") -> list[Obligation]:
        """Its obligations (of the checks whose label contains ``only``)."""
        return _run_obligations(self.system, self.ids, self.checks(only), self.code, self.oracle)


#: L14: the runtime's hot loops, run on z3 terms (:mod:`proofs.loops`), do what the rules
#: say on every path through them.
LOOPS = CodeRun(loops.SYSTEM, ("L14",), loops.checks, "the loop", "the rules do")
#: L15: the real ``LeaseTable`` run on z3 terms (:mod:`proofs.structures`) does what the
#: naive model does on every feasible path of each scenario.
STRUCTURES = CodeRun(
    structures.SYSTEM, ("L15", "I4", "I13"), structures.checks, "the table", "the naive model does"
)
#: L16: the real ``HeartbeatTracker`` run on z3 times (:mod:`proofs.tracking`) does what
#: the naive model of spec §7 does on every feasible path of each scenario.
TRACKER = CodeRun(
    tracking.SYSTEM, ("L16", "I11"), tracking.checks, "the tracker", "the naive model does"
)
#: L17: the wire codec (:mod:`proofs.codec`) is the grammar of spec §3.6 on every input
#: of a bounded set of its edge cases.
WIRE = CodeRun(codec.SYSTEM, ("L17", "I13"), codec.checks, "the codec", "the spec's grammar does")
#: L18: the settings and argument checks (:mod:`proofs.settings`) are the rules C1-C7,
#: spec §10's misuse and §5.3's first-contact check.
SETTINGS = CodeRun(
    settings.SYSTEM, ("L18", "I8"), settings.checks, "the code", "the spec's rules do"
)
#: L19: ``ClockOffset`` and the read gate (:mod:`proofs.clock_gate`) are spec §8.7,
#: exactly, on every sequence of samples of a bounded pool.
CLOCK = CodeRun(clock_gate.SYSTEM, ("L19", "I9"), clock_gate.checks, "the clock", "spec §8.7 does")
#: L20: the router's give-up rule (:mod:`proofs.giveup_rule`) is spec §2.1's, on every
#: input of a bounded set (I17's table; the model checker's scope ``giveup`` shows the
#: aborts it names leave nothing held).
GIVEUP = CodeRun(
    giveup_rule.SYSTEM, ("L20", "I17"), giveup_rule.checks, "the rule", "spec §2.1 does"
)
#: every code run, in ``all_obligations``' order
CODE_RUNS = (LOOPS, STRUCTURES, TRACKER, WIRE, SETTINGS, CLOCK, GIVEUP)

# each code run's obligations, by the name the rest of proofs/ and the tests call them
loop_obligations = LOOPS.obligations
structure_obligations = STRUCTURES.obligations
tracker_obligations = TRACKER.obligations
wire_obligations = WIRE.obligations
settings_obligations = SETTINGS.obligations
clock_obligations = CLOCK.obligations
giveup_obligations = GIVEUP.obligations


def _run_obligations(
    system: str, ids: tuple[str, ...], checks: list[tuple[str, Any]], code: str, oracle: str
) -> list[Obligation]:
    """An obligation per check: no path or input differs. A check whose code raised adds
    one that fails as a crash (what it compared before raising still has to agree)."""
    obs = []
    for label, chk in checks:

        def show(m: Any, chk: Any = chk) -> list[str]:
            where = [name for name, f in chk.bad if z3.is_true(m.eval(f, model_completion=True))]
            values = " ".join(sorted(f"{d.name()}={m[d]}" for d in m.decls()))
            return [f"on {where[0] if where else 'a path'}: {values}"]

        if chk.bad or not chk.error:
            obs.append(
                Obligation(
                    system,
                    label,
                    ids,
                    "unsat",
                    [*chk.hyps, z3.Or(False, *(f for _, f in chk.bad))],
                    show,
                    why=f"a path through {code} does what {oracle} not",
                )
            )
        if chk.error:
            obs.append(
                Obligation(
                    system,
                    f"{label}: runs without raising",
                    ids,
                    "unsat",
                    [z3.BoolVal(True)],
                    why=chk.error,
                    crashed=True,
                )
            )
    return obs
