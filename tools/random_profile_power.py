"""How often, and how fast, the randomised profile finds the expire-order bug.

    python tools/random_profile_power.py --machine dense --runs 20

Re-introduces, in memory, the expire-order bug of issue 11 (``expire`` released
a renewed lease whose new deadline was also due instead of requeueing it:
``grant a@0; grant c@0; grant b@11 ttl=0.5; renew a@11; expire@31`` released
b, a, c), then runs the table machine with tests/test_random_profile.py's
settings (fresh randomness each run) ``--runs`` times and prints, per run,
whether the machine's model check caught it, after how many examples and how
much CPU time. Shrinking is skipped (only finding counts).
"""

from __future__ import annotations
import __future__

import argparse
import inspect
import sys
import textwrap
import time
import traceback
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from leaseproto.core.deadlines import DeadlineQueue
from leaseproto.testing import machine as M

# the reaper takes a lease found in the bucket of an older deadline only when it was not
# renewed since; the bug took it whenever its new deadline was due too (out of order)
FIX = "if later == d:"
BUG = "if later <= now:"


def reintroduce_the_bug() -> None:
    src = textwrap.dedent(inspect.getsource(DeadlineQueue.take_due))
    assert src.count(FIX) == 1, "the fix is not where it was: update this tool"
    code = compile(
        src.replace(FIX, BUG),
        "<expire-order bug>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    ns: dict[str, Any] = {}
    exec(code, vars(sys.modules[DeadlineQueue.__module__]), ns)
    DeadlineQueue.take_due = ns["take_due"]  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", choices=["wide", "dense"], default="dense")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--examples", type=int, default=None, help="default: the profile test's")
    ap.add_argument("--steps", type=int, default=None, help="default: the profile test's")
    args = ap.parse_args(argv)
    sys.path.insert(0, "tests")
    import test_random_profile as prof  # noqa: PLC0415  (tests/ is not a package)

    base = prof.DENSE if args.machine == "dense" else prof.RANDOM
    machine = M.DenseLeaseTableMachine if args.machine == "dense" else M.LeaseTableMachine
    examples = args.examples or base.max_examples
    steps = args.steps or base.stateful_step_count
    reintroduce_the_bug()
    found, cpu_found = 0, []
    count = [0]

    class Counting(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            count[0] += 1
            super().__init__()

    for i in range(args.runs):
        count[0] = 0
        s = settings(
            base,
            max_examples=examples,
            stateful_step_count=steps,
            phases=[p for p in Phase if p is not Phase.shrink],
            suppress_health_check=list(HealthCheck),
        )
        t, c = time.perf_counter(), time.process_time()
        try:
            run_state_machine_as_test(Counting, settings=s)
            out = "not found"
        except AssertionError as exc:
            lines = [f.line for f in traceback.extract_tb(exc.__traceback__)]
            if "assert got == want" not in lines:
                raise
            found += 1
            cpu_found.append(time.process_time() - c)
            out = "FOUND"
        print(
            f"run {i}: {out} after {count[0]} examples, "
            f"{time.process_time() - c:.1f} s CPU, {time.perf_counter() - t:.1f} s wall",
            flush=True,
        )
    cpu_found.sort()
    med = cpu_found[len(cpu_found) // 2] if cpu_found else float("nan")
    print(
        f"{args.machine}: found in {found} of {args.runs} runs "
        f"({examples} examples x {steps} steps); median CPU to find {med:.1f} s, "
        f"max {max(cpu_found, default=float('nan')):.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
