"""The model checker's verdicts and its newer checks and scopes (issue 20): a crash
and a misuse are verdicts apart from an invariant violation; a renewal applies only
before the deadline and to exactly the spec's value; the lifetime cap; staging with
``n`` other than the granted consumers; the deadline queue's compaction and
``next_deadline``; the read gate under clock drift with the offset's ageing. Each
check is shown failing on a mutant of the real code that the scope it runs in
catches only through it (the real code passes the same scope)."""

from __future__ import annotations

from typing import Any

import pytest
from test_checker import NEW_CHECKS, mutate

from leaseproto.checker import INVARIANTS, SCOPES, Violation, check, invariants
from leaseproto.checker.compaction import EagerQueue
from leaseproto.checker.explore import CRASH, MISUSE, OK, VIOLATION
from leaseproto.checker.scope import QUICK
from leaseproto.core import renewal, rules, wire
from leaseproto.core.deadlines import DeadlineQueue
from leaseproto.core.errors import LocalProtocolError
from leaseproto.core.table import LeaseTable
from leaseproto.workers import verdicts

# The renewal mutants change the loops the table runs (core/renewal.py): the
# common loop of renew_ids and renew_capped for capped leases, and renew_ids'
# general loop (tombstones, unknown ids), so whichever loop a scope reaches is wrong.


def _lapsed_renews(mp: pytest.MonkeyPatch) -> None:
    """A renewal that also applies at ``now >= deadline`` (before the reap)."""
    mutate(mp, renewal, "renew_ids", "if now < deadline:", "if True:", count=2)
    mutate(mp, renewal, "renew_capped", "if now < deadline:", "if True:")


def _short(mp: pytest.MonkeyPatch) -> None:
    """A renewal half a tick short of ``now + lease_extension``."""
    for loop in ("renew_ids", "renew_capped"):
        old = "target = now + extension"
        mutate(mp, renewal, loop, old, old + " - 0.5")


def _grant_past_ttl(mp: pytest.MonkeyPatch) -> None:
    """A grant whose lease runs a tick past its ttl."""
    mutate(
        mp,
        LeaseTable,
        "grant",
        "R.grant_deadline(now, float(ttl))",
        "R.grant_deadline(now, float(ttl) + 1)",
    )


def _cap_by(shift: float) -> Any:
    """A renewal capped ``shift`` past (or, negative, before) ``granted_at + cap``."""

    def apply(mp: pytest.MonkeyPatch) -> None:
        mutate(
            mp,
            renewal,
            "renew_ids",
            "new = new if new <= cap_at else cap_at",
            f"new = new if new <= cap_at + {shift} else cap_at + {shift}",
        )
        mutate(
            mp,
            renewal,
            "renew_capped",
            "new = target if target <= cap_at else cap_at",
            f"new = target if target <= cap_at + {shift} else cap_at + {shift}",
        )

    return apply


#: name -> (apply the mutant, scope, the invariant the new check names)
CHECKS: dict[str, tuple[Any, Any, str]] = {
    "a heartbeat renews a lapsed lease (I2)": (
        _lapsed_renews,
        QUICK["small-pause"],
        "I2",
    ),
    "a renewal half a tick short (I8)": (_short, QUICK["small"], "I8"),
    "a renewal half a tick past the cap (I7)": (
        _cap_by(0.5),
        QUICK["cap"],
        "I7",
    ),
    "a renewal stopping half a tick before the cap (I8)": (
        _cap_by(-0.5),
        QUICK["cap"],
        "I8",
    ),
    "readers from the wire ignored after the grant (I10)": (
        NEW_CHECKS["readers from the wire ignored (D with 2 ranks, I10)"][0],
        QUICK["ranks-n"],
        "I10",
    ),
    "readers of a staged transfer-done ignored at grant (I10)": (
        lambda mp: mutate(
            mp,
            LeaseTable,
            "grant",
            "readers = int(staged[3]) or lease.consumers",
            "readers = lease.consumers",
        ),
        QUICK["ranks-n"],
        "I10",
    ),
    "compaction keeps the stale entries, drops the live (I4)": (
        lambda mp: mutate(
            mp,
            DeadlineQueue,
            "compact",
            "if live.get(lease.req_id) is lease]",
            "if live.get(lease.req_id) is not lease]",
        ),
        QUICK["compaction"],
        "I4",
    ),
    "compaction forgets the heap (I4)": (
        lambda mp: mutate(
            mp, DeadlineQueue, "compact", "self._keys = list(self._buckets)", "self._keys = []"
        ),
        QUICK["compaction"],
        "I4",
    ),
    "next_deadline skips the first live lease (I4)": (
        lambda mp: mutate(
            mp, DeadlineQueue, "next_deadline", "del bucket[:i]", "del bucket[: i + 1]"
        ),
        QUICK["compaction"],
        "I4",
    ),
    # the workers' own decisions (leaseproto/workers/verdicts.py), which the checker drives
    "D takes one P rank's OK for every rank's (I13, take_verdict)": (
        lambda mp: mutate(mp, verdicts, "take_verdict", "due.discard(sender)", "due.clear()"),
        QUICK["ranks-n"],
        "I13",
    ),
    "D takes an NK as an OK (I13, take_verdict)": (
        lambda mp: mutate(
            mp, verdicts, "take_verdict", "    if not ok:\n        return DISCARD\n", ""
        ),
        QUICK["small-pause"],
        "I13",
    ),
    "P answers OK to every transfer-done (I13, the prefill worker's transfer_done)": (
        lambda mp: mutate(
            mp,
            verdicts,
            "transfer_done",
            "return out, wire.verdict(msg.req_id, out)",
            "return out, wire.Ok(msg.req_id)",
        ),
        QUICK["small"],
        "I13",
    ),
    "the offset's uncertainty does not age (I9, drift)": (
        lambda mp: mp.setattr(rules, "aged_uncertainty", lambda u, age, rho: u),
        QUICK["drift"],
        "I9",
    ),
    "the offset's uncertainty ages at half the rule's rate (I9, drift)": (
        lambda mp: mp.setattr(
            rules, "aged_uncertainty", lambda u, age, rho: u + rho / (1 - rho) * age
        ),
        QUICK["drift"],
        "I9",
    ),
    # the turn-2 read (spec §2.8): D grants the cached lease, P heartbeats and verifies
    "D answers OK whatever its cached lease (I14, turn2)": (
        lambda mp: mp.setattr(wire, "verdict", lambda r, res: wire.Ok(r)),
        QUICK["turn2"],
        "I14",
    ),
    "a renewal of D's cached lease half a tick short (I16, turn2)": (
        _short,
        QUICK["turn2"],
        "I16",
    ),
    "D's cached lease granted a tick past its ttl (I16, turn2)": (
        _grant_past_ttl,
        QUICK["turn2"],
        "I16",
    ),
}


def assert_caught(name: str, mutant: tuple[Any, Any, str], mp: pytest.MonkeyPatch) -> None:
    """``mutant`` (apply it, the scope, the invariant) fails its scope naming the invariant."""
    apply, scope, inv = mutant
    apply(mp)
    res = check(scope)
    assert res.verdict == VIOLATION, f"{name}: not caught ({res.summary()})"
    assert res.violation is not None and res.violation.inv == inv, res.summary()
    assert inv in INVARIANTS


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_each_new_check_fails_on_its_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_caught(name, CHECKS[name], monkeypatch)


#: what each new scope adds: the same mutant passes the scope it extends
WITHOUT: dict[str, str] = {
    "a heartbeat renews a lapsed lease (I2)": "small",
    "readers from the wire ignored after the grant (I10)": "small",
    "readers of a staged transfer-done ignored at grant (I10)": "ranks",
    "the offset's uncertainty does not age (I9, drift)": "gate",
}


@pytest.mark.parametrize("name", sorted(WITHOUT))
def test_the_mutant_needs_the_new_scope(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    apply, _, _ = CHECKS[name]
    apply(monkeypatch)
    res = check(QUICK[WITHOUT[name]])
    assert res.ok, res.summary()


def _check_use_of_reads_only(w: Any, r: str) -> None:
    """``check_use`` before it required a read from every P rank: only the reads made."""
    for (rr, d, p), held in w.reads.items():
        if rr == r and not held:
            raise Violation("I13", f"D used {r}'s KV read by {d} from {p} after its lease ended")


def test_an_ok_from_one_rank_is_caught_only_by_the_check_of_every_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D using a request once one P rank said OK (the worker's ``take_verdict``
    clearing every owed verdict) is I13 by the check that each D rank read from
    every P rank before the use; with only the reads made checked, it passes."""
    apply, scope, _ = CHECKS["D takes one P rank's OK for every rank's (I13, take_verdict)"]
    apply(monkeypatch)
    monkeypatch.setattr(invariants, "check_use", _check_use_of_reads_only)
    res = check(scope)
    assert res.ok, res.summary()


def test_the_checker_drives_the_workers_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The world calls the workers' own functions (a spy counts the calls), and the
    workers call them too: one implementation."""
    import inspect

    from leaseproto.workers import decode_follower, decode_leases, decode_reads, prefill_acts

    calls: dict[str, int] = {}
    for name in ("transfer_done", "take_verdict", "lease_lost_answers", "readers_per_p_rank"):
        orig = getattr(verdicts, name)

        def spy(*a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            calls[_name] = calls.get(_name, 0) + 1
            return _orig(*a, **kw)

        monkeypatch.setattr(verdicts, name, spy)
    assert check(QUICK["small"]).ok
    assert set(calls) == {
        "transfer_done",
        "take_verdict",
        "lease_lost_answers",
        "readers_per_p_rank",
    }, calls
    uses = {
        prefill_acts: (
            "verdicts.transfer_done",
            "verdicts.lease_lost_answers",
            "verdicts.answer",
        ),
        decode_reads: ("verdicts.take_verdict", "verdicts.readers_per_p_rank"),
        decode_leases: ("verdicts.lease_lost_gives_up",),
        decode_follower: ("verdicts.take_verdict",),
    }
    for module, names in uses.items():
        src = inspect.getsource(module)
        assert all(n + "(" in src for n in names), module.__name__


def test_the_compaction_scope_compacts_under_live_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scope reaches ``compact`` with a lease live (the real table's own test
    of its stale count decides, shifted by the scope's slack)."""
    seen: list[int] = []
    orig = DeadlineQueue.compact

    def compact(self: DeadlineQueue, live: dict[str, Any]) -> None:
        seen.append(len(live))
        orig(self, live)

    monkeypatch.setattr(DeadlineQueue, "compact", compact)
    res = check(QUICK["compaction"])
    assert res.ok, res.summary()
    assert any(n > 0 for n in seen), seen
    before = len(seen)
    assert check(QUICK["two"]).ok
    assert len(seen) == before  # the same world without the slack: the table's 1024


def test_the_eager_queue_counts_stale_entries_as_the_table_does() -> None:
    q = EagerQueue(-1)
    assert q.stale_entries == 0 and q.stale == 1025
    q.stale += 1
    assert q.stale_entries == 1
    q.stale = max(0, q.stale - 1)
    assert q.stale_entries == 0
    q.stale = 0  # compact's reset
    assert q.stale_entries == 0
    copy = q.copy(lambda lease: lease)
    assert isinstance(copy, EagerQueue) and copy.stale == q.stale


def test_a_crash_is_a_verdict_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python exception of the code under test ends the run as ``crash``, with
    the exception and where it came from, not as an invariant violation."""
    mutate(monkeypatch, LeaseTable, "expire", "self._prune(now)", "self._prune(now)\n    {}['x']")
    res = check(QUICK["small"])
    assert res.verdict == CRASH and res.violation is not None, res.summary()
    assert res.violation.inv == "crash" and "KeyError" in res.violation.text, res.summary()
    assert "expire" in res.violation.text and "CRASH" in res.summary()


def test_a_misuse_is_a_verdict_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: LeaseTable, *a: Any, **kw: Any) -> None:
        raise LocalProtocolError("refused")

    monkeypatch.setattr(LeaseTable, "abort", refuse)
    res = check(QUICK["small"])
    assert res.verdict == MISUSE and res.violation is not None, res.summary()
    assert "MISUSE" in res.summary()


def test_the_real_code_passes_with_verdict_ok() -> None:
    res = check(QUICK["small"])
    assert res.verdict == OK and res.ok


def test_drift_breaks_no_assumption_of_the_gate() -> None:
    with pytest.raises(ValueError, match="A5"):
        SCOPES["drift"].with_(d_rate=0.3)  # below (1 - rho) / (1 + rho) = 1/3


def test_check_as_typed_explores_each_scope_to_its_own_bound(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``leaseproto check --scope faults`` stopped at a default of 200,000 states
    (the scope has 907,910): the CLI now keeps each scope's own bound, above its
    state count for every scope but ``large``; ``--max-states`` still overrides."""
    from leaseproto.checker.explore import Result
    from leaseproto.cli import check_cmd, main

    seen: list[int] = []

    def fake(scope: Any) -> Result:
        seen.append(scope.max_states)
        return Result(scope)

    monkeypatch.setattr(check_cmd, "check", fake)
    assert main(["check", "--scope", "faults"]) == 0
    assert main(["check", "--scope", "faults", "--max-states", "10"]) == 0
    assert seen == [3_000_000, 10]
    for name, states in {"faults": 907_910, "ranks": 613_540, "two": 1_853_392}.items():
        assert SCOPES[name].max_states > states  # the README's exhaustive counts
    assert SCOPES["schedule"].max_states > 1_495_574
