"""The model checker (leaseproto.checker) over the real classes: the small
scopes are explored exhaustively with no violation, and each of the ten bugs a
review seeded into the table and the tracker is caught, naming its invariant."""

from __future__ import annotations
import __future__

import inspect
import sys
import textwrap
import types
from typing import Any

import pytest

from leaseproto.checker import INVARIANTS, SCOPES, check
from leaseproto.checker.scope import QUICK
from leaseproto.core import renewal
from leaseproto.core.clock import ClockOffset
from leaseproto.core.config import LeaseConfig
from leaseproto.core.deadlines import DeadlineQueue
from leaseproto.core.table import LeaseTable
from leaseproto.core.tracker import HeartbeatTracker


def mutate(
    mp: pytest.MonkeyPatch, cls: Any, name: str, old: str, new: str, *, count: int = 1
) -> None:
    """Replace ``cls.name`` (a method, or a module's function) by its own source with
    ``old`` (found exactly ``count`` times) replaced by ``new``."""
    src = textwrap.dedent(inspect.getsource(getattr(cls, name)))
    assert src.count(old) == count, f"{old!r} not found {count} times in {cls.__name__}.{name}"
    code = compile(
        src.replace(old, new),
        f"<mutant {cls.__name__}.{name}>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    ns: dict[str, Any] = {}
    home = cls if isinstance(cls, types.ModuleType) else sys.modules[cls.__module__]
    exec(code, vars(home), ns)
    mp.setattr(cls, name, ns[name])


ONE_TOMBSTONE = SCOPES["two"].config.__class__(
    **{**SCOPES["two"].config.as_dict(), "tombstone_capacity": 1}
)

#: name -> (class, method, old, new, scope, invariant the checker must name)
SEEDED: dict[str, tuple[Any, str, str, str, Any, str]] = {
    "renewed queue entry requeued 1 s late": (
        DeadlineQueue,
        "take_due",
        "bucket = buckets.get(later)",
        "later += 1\n            bucket = buckets.get(later)",
        SCOPES["small"].with_(d_crash=True),
        "I4",
    ),
    "renewed queue entry dropped, not requeued": (
        DeadlineQueue,
        "take_due",
        "bucket = buckets.get(later)",
        "continue\n            bucket = buckets.get(later)",
        SCOPES["small"].with_(d_crash=True),
        "I4",
    ),
    "no tombstone for ABORTED": (
        LeaseTable,
        "_end",
        "self._ended[lease.req_id] = tomb",
        "if state != R.ABORTED:\n        self._ended[lease.req_id] = tomb",
        SCOPES["small"],
        "I13",
    ),
    "one staged transfer-done fewer applied at grant": (
        LeaseTable,
        "grant",
        "for _ in range(int(staged[1])):",
        "for _ in range(int(staged[1]) - 1):",
        SCOPES["ranks"],
        "I10",
    ),
    "lost-lease reports (NACKs) after TRANSFERRED": (
        renewal,  # the loop over heartbeat ids
        "renew_ids",
        "if lost is not None and tomb[0] != R.TRANSFERRED:",
        "if lost is not None:",
        SCOPES["small"],
        "I13",
    ),
    "tombstone eviction drops the newest": (
        LeaseTable,
        "_end",
        "self._ended.popitem(last=False)",
        "self._ended.popitem(last=True)",
        SCOPES["two"].with_(config=ONE_TOMBSTONE),
        "I13",
    ),
    "tracker shortcut takes the max": (
        HeartbeatTracker,
        "_threshold",
        "oldest = next(iter(lasts.values()))",
        "oldest = max(lasts.values())",
        SCOPES["schedule"],
        "I11",
    ),
    "pending engine loses its turn": (
        HeartbeatTracker,
        "due",
        'self._c["deferred"] += 1\n            continue',
        'self._c["deferred"] += 1\n            self._last_sent[engine] = now\n            continue',
        SCOPES["schedule"],
        "I11",
    ),
    "late transfer-done after EXPIRED treated as excess": (
        LeaseTable,
        "transfer_done",
        'self._c["excess_transfers" if state == R.TRANSFERRED else "late_transfers"] += 1',
        "if state in (R.TRANSFERRED, R.EXPIRED):\n"
        '        self._c["excess_transfers"] += 1\n'
        "        return None\n"
        '    self._c["late_transfers"] += 1',
        SCOPES["faults"].with_(p_restarts=0, regrants=0, dups=0),
        "I13",
    ),
    "staged abort ignored at grant": (
        LeaseTable,
        "grant",
        "if staged[2]:",
        "if False:",
        SCOPES["ranks"],
        "I2",
    ),
}


def test_the_small_scope_is_explored_exhaustively_without_violation() -> None:
    res = check(SCOPES["small"])
    assert res.ok, res.summary()
    assert not res.bounded and res.states > 1000


@pytest.mark.parametrize("name", sorted({s[4].name for s in SEEDED.values()} - {"small"}))
def test_the_mutation_scopes_hold_on_the_real_code(name: str) -> None:
    scopes = [s[4] for s in SEEDED.values() if s[4].name == name]
    for scope in {id(s): s for s in scopes}.values():
        res = check(scope.with_(max_states=min(scope.max_states, 3_000)))
        assert res.ok, res.summary()


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_each_seeded_bug_is_caught_naming_its_invariant(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, method, old, new, scope, inv = SEEDED[name]
    mutate(monkeypatch, cls, method, old, new)
    res = check(scope.with_(max_states=min(scope.max_states, 200_000)))
    assert res.violation is not None, f"{name}: not caught ({res.summary()})"
    assert res.violation.inv == inv, res.summary()
    assert inv in INVARIANTS and res.trace, res.summary()


#: the quick scopes explored exhaustively (the others stop at their bound)
EXHAUSTIVE = {"small", "small-crash", "small-pause", "d2", "cap", "gate"} | {
    f"push-{name}" for name in ("pause", "crash", "cancel", "abort", "w2")
}


@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_quick_scopes_hold_on_the_real_code(name: str) -> None:
    """What the mutation run (tools/mutation_run.py) explores for each mutant."""
    res = check(QUICK[name])
    assert res.ok, res.summary()
    assert res.states > 1000, res.summary()
    assert res.bounded is (name not in EXHAUSTIVE), res.summary()


#: ``faults`` without duplicates and lost heartbeats: P restarts and re-grants, D crashes
#: and pauses past its lease, exhaustively in about 20 s (``faults`` itself is about a
#: million states: ``leaseproto check --scope faults``, docs/verification.md)
FAULTS_NO_NET = SCOPES["faults"].with_(name="faults-no-net", dups=0, losses=0, max_states=400_000)


def test_restarts_and_regrants_are_explored_exhaustively_without_violation() -> None:
    res = check(FAULTS_NO_NET)
    assert res.ok and not res.bounded, res.summary()
    # each fault the scope allows was taken (a budget never spent would check nothing)
    for action in ("p_restart", "regrant", "d_crash", "d_pause", "read", "abort"):
        assert res.taken[action] > 0, (action, dict(res.taken))


def test_a_regrant_that_breaks_A7_breaks_I13() -> None:
    """Why the checked world re-grants an id only once nothing of its last lease can
    act (spec §3.3, A7): re-granting any ended id, the shortest run that uses a freed
    read is a P restart, a read under the old id, and its transfer-done reaching the
    re-granted lease, which answers OK."""
    res = check(FAULTS_NO_NET.with_(unique_ids=False))
    assert res.violation is not None and res.violation.inv == "I13", res.summary()
    steps = [s.split(" ", 1)[1] for s in res.trace]
    assert len(steps) == 17, res.summary()
    order = [
        "grant P0 r0",
        "p_restart P0",
        "read r0 D0 P0",
        "regrant P0 r0",
        "arrive P0->D0 'OK:r0'",
    ]
    assert [s for s in steps if s in order] == order, res.summary()


#: the checks added for I5, I6 (ghost bounds), I7, I9 and D with two ranks, each shown
#: to fail on a mutant of the real code: name -> (apply, scope, invariant)
NEW_CHECKS: dict[str, tuple[Any, Any, str]] = {
    "grant deadline 1 s past ttl (I5)": (
        lambda mp: mutate(
            mp,
            LeaseTable,
            "grant",
            "R.grant_deadline(now, float(ttl))",
            "R.grant_deadline(now, float(ttl)) + 1",
        ),
        SCOPES["small"].with_(d_crash=True),
        "I5",
    ),
    "renewal extends 1 s too far (I6)": (
        lambda mp: mutate(
            mp,
            renewal,
            "renew_ids",
            "held.deadline = deadline if deadline >= target else target  # vmax (I1)",
            "held.deadline = deadline if deadline >= target + 1 else target + 1",
        ),
        SCOPES["small"],
        "I6",
    ),
    "renewal ignores the cap (I7)": (
        lambda mp: mutate(
            mp,
            renewal,
            "renew_capped",
            "new = target if target <= cap_at else cap_at  # vmin: never past the cap (I7)",
            "new = target",
        ),
        SCOPES["cap"],
        "I7",
    ),
    "clock offset with the wrong sign (I9)": (
        lambda mp: mutate(
            mp,
            ClockOffset,
            "add_sample",
            "self._offset = remote_time - (t0 + t1) / 2",
            "self._offset = (t0 + t1) / 2 - remote_time",
        ),
        SCOPES["gate"],
        "I9",
    ),
    "read gate without the uncertainty (I9)": (
        lambda mp: mp.setattr(ClockOffset, "uncertainty_at", lambda self, now: 0.0),
        SCOPES["gate"],
        "I9",
    ),
    "readers from the wire ignored (D with 2 ranks, I10)": (
        lambda mp: mutate(
            mp,
            LeaseTable,
            "transfer_done",
            "n = lease.consumers if readers is None else readers",
            "n = lease.consumers",
        ),
        SCOPES["d2"],
        "I10",
    ),
}


@pytest.mark.parametrize("name", sorted(NEW_CHECKS))
def test_each_new_check_fails_on_a_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    apply, scope, inv = NEW_CHECKS[name]
    assert check(scope).ok  # the real code passes the same scope
    apply(monkeypatch)
    res = check(scope)
    assert res.violation is not None, f"{name}: not caught ({res.summary()})"
    assert res.violation.inv == inv, res.summary()
    assert inv in INVARIANTS


def test_the_readers_mutant_passes_with_one_d_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the two-rank scope adds: with one D rank the same mutant goes unseen."""
    apply, _, _ = NEW_CHECKS["readers from the wire ignored (D with 2 ranks, I10)"]
    apply(monkeypatch)
    assert check(SCOPES["small"]).ok


def test_the_trace_is_printed_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cls, method, old, new, scope, _ = SEEDED["staged abort ignored at grant"]
    mutate(monkeypatch, cls, method, old, new)
    out = check(scope).summary()
    assert "VIOLATION of I2" in out and "abort r0" in out and "grant P1 r0" in out, out


def test_config_of_the_scopes_is_valid() -> None:
    for scope in SCOPES.values():
        assert isinstance(scope.config, LeaseConfig)


def test_the_checker_imports_only_the_core_and_the_standard_library() -> None:
    import ast
    import pathlib

    import leaseproto.checker as pkg

    allowed_roots = set(sys.stdlib_module_names)
    for path in pathlib.Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1:
                    continue  # a sibling in leaseproto.checker
                if node.level == 2 and mod == "workers":  # the workers' pure decisions
                    assert [a.name for a in node.names] in (["verdicts"], ["giveup"]), path.name
                    continue
                if node.level == 2:
                    assert mod.startswith("core"), f"{path.name} imports ..{mod}"
                    continue
                assert mod.split(".")[0] in allowed_roots, f"{path.name} imports {mod}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in allowed_roots, (path.name, alias.name)
    # ... and those import only the core and the standard library
    verdicts = pathlib.Path(pkg.__file__).parent.parent / "workers" / "verdicts.py"
    for node in ast.walk(ast.parse(verdicts.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 2 and (node.module or "").startswith("core"), node.module
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
            )
            assert all(n.split(".")[0] in allowed_roots for n in names), names
