"""The three layers of the mutation run (tools/mutation_run.py), as they run in a
forked child: the import hook that serves a mutated module, the runners, the
baseline's line tracer, and each unit's time limit.

A unit (one test, one checker scope, one unit of the proofs) that runs past its
limit kills the mutant: the limit is a multiple of that unit's own time in the
baseline (which ran under the line tracer, itself several times slower), so only a
mutant that loops or slows a unit by an order of magnitude reaches it. Times are the
process's CPU time, not the wall clock, so a machine loaded by other work does not
turn slow units into kills. A process-wide CPU limit backs it up for a hang the
interpreter cannot interrupt, and the runner's wall-clock alarm for one that uses no CPU.
"""

# ruff: noqa: PLC0415  (the layers import what they test in the child, after the hook)
from __future__ import annotations

import importlib.abc
import importlib.util
import io
import json
import linecache
import os
import re
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import CORE, MODULES, ROOT, Mutant, mutated_source

TEST_FILES = [  # the fast ones first (a run stops at its first failure)
    "tests/test_core_exports.py",
    "tests/test_core_records.py",
    "tests/test_core_edges.py",
    "tests/test_bad_input.py",
    "tests/test_state_table.py",
    "tests/test_verdicts.py",
    "tests/test_push_registrations.py",
    "tests/test_peer.py",
    "tests/test_config.py",
    "tests/test_clock.py",
    "tests/test_table.py",
    "tests/test_tracker.py",
    "tests/test_rules_agree.py",
    "tests/test_messages.py",
    "tests/test_wire.py",
    "tests/test_specialise.py",
    "tests/test_hot_paths.py",
    "tests/test_model.py",
    "tests/test_composed.py",
    "tests/test_stateful.py",
    "tests/test_replay.py",
]
LAYERS = ("tests", "checker", "proofs")
#: how a layer killed a mutant (a row's ``kind``): wrong behaviour (a violated invariant,
#: a failed obligation or test), a misuse error the core raised, a crash (any other
#: exception of the mutated code), or a unit past its time limit
KINDS = ("behaviour", "misuse", "crash", "timeout")
#: the checker's verdicts (leaseproto.checker.explore) as kinds
_CHECKER_KIND = {"violation": "behaviour", "misuse": "misuse", "crash": "crash"}
_LEGACY = re.compile(r"^[\w-]+: (I\d+|deadlock|wire|misuse): ")


def kind_of(layer: str, rec: dict[str, Any]) -> str | None:
    """How ``layer`` killed a mutant (one of :data:`KINDS`), None when it did not.
    Rows written before kinds were recorded are read from their ``first`` line."""
    if not rec.get("killed"):
        return None
    if "kind" in rec:
        return str(rec["kind"])
    first = str(rec.get("first", ""))
    if first.startswith("timeout"):
        return "timeout"
    if layer != "checker":  # a failed test or obligation; an exception says its type
        return "crash" if re.match(r"^\w+(Error|Exception): ", first) else "behaviour"
    m = _LEGACY.match(first)
    if m is None:
        return "crash"
    return "misuse" if m.group(1) == "misuse" else "behaviour"


#: a unit's limit: FACTOR times its traced baseline time, and never under FLOOR seconds
FACTOR = {"tests": 10.0, "checker": 6.0, "proofs": 4.0}
FLOOR = {"tests": 10.0, "checker": 10.0, "proofs": 30.0}


def unit_limit(layer: str, took: float | None) -> float:
    return max(FLOOR[layer], FACTOR[layer] * (took or 0.0))


class _Serve(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one module's mutated source (and puts it in linecache, so that
    ``inspect.getsource`` sees what runs)."""

    def __init__(self, name: str, path: Path, source: str) -> None:
        self.name, self.path, self.source = name, str(path), source
        lines = source.splitlines(keepends=True)
        linecache.cache[self.path] = (len(source), None, lines, self.path)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path, loader=self)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        exec(compile(self.source, self.path, "exec", dont_inherit=True), vars(module))


class Limits:
    """The child's timer, in CPU seconds of the process: each unit armed with its own
    limit, the layer's as the outer one. On expiry the child writes its verdict
    (killed: timeout) and exits."""

    def __init__(self, out: Path, layer: str, total: float, took: dict[str, float]) -> None:
        self.out, self.layer, self.took = out, layer, took
        self.end = time.process_time() + total
        self.what = f"the {layer} layer"
        self.limit = total
        signal.signal(signal.SIGPROF, self._expired)
        cpu = int(total) + 10  # the backstop: SIGXCPU ends a hang in C code
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        self.disarm()

    def _expired(self, signum: int, frame: Any) -> None:
        first = f"timeout ({self.limit:.0f} s): {self.what}"[:200]
        record = {"killed": True, "kind": "timeout", "first": first}
        self.out.write_text(json.dumps(record))
        os._exit(0)

    def arm(self, unit: str) -> None:
        self.what = unit
        self.limit = min(unit_limit(self.layer, self.took.get(unit)), self._left())
        signal.setitimer(signal.ITIMER_PROF, self.limit)

    def disarm(self) -> None:
        self.what = f"the {self.layer} layer"
        self.limit = self._left()
        signal.setitimer(signal.ITIMER_PROF, self.limit)

    def _left(self) -> float:
        return max(self.end - time.process_time(), 0.01)


# -- the layers --------------------------------------------------------------------------------
def _run_tests(units: list[str] | None, record: dict[str, Any], limits: Limits | None) -> bool:
    import pytest

    class First:
        def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
            if limits is not None:
                limits.arm(nodeid)

        def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
            if limits is not None:
                limits.disarm()

        def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
            if "kind" not in record and call.excinfo is not None:
                record["kind"] = failure_kind(call.excinfo.value)
                record["error"] = f"{type(call.excinfo.value).__name__}"

        def pytest_runtest_logreport(self, report: Any) -> None:
            if report.failed and "first" not in record:
                record["first"] = report.nodeid

        def pytest_collectreport(self, report: Any) -> None:
            if report.failed and "first" not in record:
                record["first"] = f"collect {report.nodeid}"
                record["kind"] = "crash"  # the mutated module does not even import

    args = ["-x", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    rc = pytest.main([*args, *(units if units is not None else TEST_FILES)], plugins=[First()])
    record["rc"] = int(rc)
    if rc:
        record.setdefault("kind", "behaviour")
    return int(rc) != 0


def failure_kind(exc: BaseException) -> str:
    """How a failed test killed a mutant: ``behaviour`` when it failed an assertion (an
    ``assert``, ``pytest.raises`` that saw nothing raised, ``pytest.fail``, a hypothesis
    check), ``misuse`` when the core refused a call (a ``LeaseProtocolError`` the test
    did not expect), ``crash`` for any other exception (the mutated code raised it).
    A group (hypothesis' several failures) is behaviour if any member is."""
    from _pytest.outcomes import OutcomeException
    from hypothesis.errors import HypothesisException

    from leaseproto.core.errors import LeaseProtocolError

    group = getattr(exc, "exceptions", None)  # a (Base)ExceptionGroup
    if isinstance(group, tuple) and group:
        kinds = {failure_kind(e) for e in group}
        return next(k for k in KINDS if k in kinds)
    if isinstance(exc, (AssertionError, OutcomeException, HypothesisException)):
        return "behaviour"
    return "misuse" if isinstance(exc, LeaseProtocolError) else "crash"


def _run_checker(units: list[str] | None, record: dict[str, Any], limits: Limits | None) -> bool:
    from leaseproto.checker import check
    from leaseproto.checker.scope import QUICK

    for name, scope in QUICK.items():
        if units is not None and name not in units:
            continue
        if limits is not None:
            limits.arm(name)
        res = check(scope)
        if limits is not None:
            limits.disarm()
        if res.violation is not None:
            record["first"] = f"{name}: {res.violation.inv}: {res.violation.text}"[:200]
            record["kind"] = _CHECKER_KIND[res.verdict]
            return True
    return False


#: z3's limit per obligation in the proofs layer (wall clock: 3 times prove's own, for a
#: machine shared with other work); an obligation it cannot decide by then is a timeout
PROOF_TIMEOUT_MS = 60_000


def _run_proofs(units: list[str] | None, record: dict[str, Any], limits: Limits | None) -> bool:
    """``leaseproto prove``'s units (``proofs/units.py``; None: all), in the order given,
    until one fails an obligation by behaviour: a unit that fails only because the
    code under proof raised (a crash) or z3 could not decide an obligation in time (a
    timeout) does not stop the run, so a later unit can still tell wrong behaviour."""
    from leaseproto.proofs import symexec
    from leaseproto.proofs.units import UNITS, run_unit

    symexec.FAIL_FAST = True  # this child's own copy: a system stops at its first refutation
    failed = crashed = unknown = 0
    out = io.StringIO()
    for name in units if units is not None else list(UNITS):
        if limits is not None:
            limits.arm(name)
        f, c, u = run_unit(name, out, PROOF_TIMEOUT_MS)
        if limits is not None:
            limits.disarm()
        failed, crashed, unknown = failed + f, crashed + c, unknown + u
        if f:
            record.setdefault("first", f"{name}: {_first_fail(out.getvalue())}"[:200])
        if f > c + u:
            record["first"] = f"{name}: {_first_fail(out.getvalue(), crashed=False)}"[:200]
            break
    record["obligations_failed"] = failed
    record["obligations_crashed"] = crashed
    record["obligations_unknown"] = unknown
    if failed:
        wrong = failed - crashed - unknown
        record["kind"] = "behaviour" if wrong else "crash" if crashed else "timeout"
    return failed != 0


def _first_fail(output: str, *, crashed: bool = True) -> str:
    """The label of the first failed obligation in ``output`` (with ``crashed=False``:
    the last one, the behaviour failure that stopped the run)."""
    fails = [ln.removeprefix("FAIL ") for ln in output.splitlines() if ln.startswith("FAIL ")]
    return (fails[0] if crashed else fails[-1]) if fails else "?"


RUNNERS = {"tests": _run_tests, "checker": _run_checker, "proofs": _run_proofs}


class _Tracer:
    """Which core lines each unit (test id, scope, the proofs) executes."""

    def __init__(self) -> None:
        self.files = {str(CORE / m): m for m in MODULES}
        self.unit = "<import>"
        self.lines: dict[str, set[tuple[str, int]]] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        mod = self.files.get(frame.f_code.co_filename)
        if mod is None:
            return None
        hits = self.lines.setdefault(self.unit, set())

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                hits.add((mod, frame.f_lineno))
            return local

        hits.add((mod, frame.f_lineno))
        return local


def baseline_child(layer: str, out: Path) -> None:
    """Runs ``layer`` on the unmutated code under the tracer; writes each unit's
    lines and how long it took."""
    tr = _Tracer()
    took: dict[str, float] = {}
    sys.settrace(tr)
    record: dict[str, Any] = {}
    if layer == "tests":
        import pytest

        class Unit:
            def pytest_runtest_setup(self, item: Any) -> None:
                tr.unit = item.nodeid
                took[item.nodeid] = time.process_time()
                sys.settrace(tr)  # a test may have replaced it

            def pytest_runtest_teardown(self, item: Any) -> None:
                started = took.get(item.nodeid)  # None: skipped before our setup
                if started is not None:
                    took[item.nodeid] = time.process_time() - started

        rc = pytest.main(["-q", "-p", "no:cacheprovider", *TEST_FILES], plugins=[Unit()])
        failed = int(rc) != 0
    elif layer == "checker":
        from leaseproto.checker import check
        from leaseproto.checker.scope import QUICK

        failed = False
        for name, scope in QUICK.items():
            tr.unit = name
            started = time.process_time()
            failed = failed or not check(scope).ok
            took[name] = time.process_time() - started
    else:
        from leaseproto.proofs.units import UNITS

        failed = False
        for name in UNITS:
            tr.unit = name
            started = time.process_time()
            failed = _run_proofs([name], record, None) or failed
            took[name] = time.process_time() - started
    sys.settrace(None)
    cov = {u: sorted(f"{m}:{n}" for m, n in s) for u, s in tr.lines.items()}
    out.write_text(json.dumps({"failed": failed, "cov": cov, "took": took}))


def child(  # noqa: PLR0917  (called positionally by the runner's fork)
    m: Mutant | None,
    layer: str,
    units: list[str] | None,
    took: dict[str, float],
    timeout: float,
    out: Path,
) -> None:
    """Runs ``layer`` on mutant ``m`` (its ``units`` only; None: all); writes the verdict."""
    if m is not None:
        sys.meta_path.insert(
            0, _Serve(f"leaseproto.core.{m.module[:-3]}", CORE / m.module, mutated_source(m))
        )
    record: dict[str, Any] = {}
    limits = Limits(out, layer, timeout, took)
    try:
        killed = RUNNERS[layer](units, record, limits)
    except BaseException as exc:  # the mutant broke the layer itself: killed
        killed, record["first"] = True, f"{type(exc).__name__}: {exc}"[:200]
        record["kind"] = "crash"
    signal.setitimer(signal.ITIMER_PROF, 0)
    record["killed"] = killed
    out.write_text(json.dumps(record))
