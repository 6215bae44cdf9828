"""The z3 proofs (proofs/): every obligation holds, the counterexamples are
found, the CLI reports failures, and a broken rule makes the proofs fail
naming the right invariant (mutation tests)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from typing import Any

import pytest
import z3
from leaseproto.proofs import check, counterexamples, cx_turn2, solver

from leaseproto import cli
from leaseproto.core import rules
from leaseproto.core.state import TRANSITIONS, Guard, Input, LeaseState, Transition
from leaseproto.core.sym import conj, ite, vmax, vmin

SPEC_IDS = {f"I{k}" for k in range(1, 13)}


def run_check(only: str | None = None, system: str | None = None) -> tuple[int, str]:
    buf = io.StringIO()
    status = check.run(only=only, out=buf, system=system)
    return status, buf.getvalue()


def test_every_obligation_is_ok() -> None:
    status, out = run_check()
    lines = [ln for ln in out.splitlines() if ln.startswith(("ok", "FAIL"))]
    assert status == 0, out
    assert len(lines) > 400
    assert all(ln.startswith("ok") for ln in lines)
    assert re.search(r"^all ok: \d+ obligations", out, re.M)


def test_every_spec_invariant_has_proof_obligations(every_obligation: list[Any]) -> None:
    obs = every_obligation
    ids = {i for ob in obs for i in ob.ids}
    assert ids >= SPEC_IDS
    for iid in SPEC_IDS:  # each one is proven (an unsat obligation), not only witnessed
        assert any(ob.expect == "unsat" and iid in ob.ids for ob in obs), iid
    # non-vacuity: every transition of every system has an enabledness check
    enabled = [ob for ob in obs if ob.label.endswith(" enabled")]
    assert len(enabled) >= 6 + 6 + 3 + 3 * 9
    assert all(ob.expect == "sat" for ob in enabled)


def test_unknown_is_a_failure() -> None:
    x, y, w = z3.Ints("x y w")
    hard = solver.Obligation(
        "t", "fermat 3", (), "unsat", [x > 0, y > 0, w > 0, x * x * x + y * y * y == w * w * w]
    )
    r = solver.solve(hard, timeout_ms=50)
    assert not r.ok and r.answer == "unknown"
    assert "FAIL" in r.detail[0]
    # each seed was tried before giving up, and an unknown from all of them still fails
    assert len(solver.RETRY_SEEDS) == 2
    assert all(f"with seed {seed}" in r.detail[0] for seed in solver.RETRY_SEEDS), r.detail


def test_counterexamples_are_found_and_printed() -> None:
    buf = io.StringIO()
    assert counterexamples.run(out=buf) == 0
    out = buf.getvalue()
    for case in counterexamples.cases():
        assert f"[{case.name}]" in out
        assert f"FAIL counterexample [{case.name}]" not in out
    blocks = re.split(r"^ok   ", out, flags=re.M)[1:]
    # one block per case, then the gate-only turn-2 read (proofs/cx_turn2.py),
    # which is searched and replayed on its own model
    assert len(blocks) == len(counterexamples.cases()) + 1
    turn2 = blocks.pop()
    assert turn2.startswith(f"counterexample [{cx_turn2.NAME}]"), turn2
    assert turn2.splitlines()[-1].strip().startswith("ok   on the real code"), turn2
    assert "frees X" in turn2 and "reused blocks" in turn2, turn2
    for block in blocks:
        if block.startswith("counterexample") and "reaper" not in block:
            # the schedule ends with P expiring the lease D still tracks, and the
            # real code does the same (tests/test_cx_replay.py replays every schedule)
            assert "expire releases the lease EXPIRED" in block.splitlines()[-2], block
            assert block.splitlines()[-1].strip().startswith("ok   on the real code"), block
            assert "D goes silent" not in block
        assert re.search(r"^\s+-?\d+\.\d{3}\s", block, re.M), block  # timeline lines
    assert "T1: " in out and "is false" in out
    assert "naive expire: A" in out and "B GRANTED" in out


def test_cli_prove_exit_codes() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "leaseproto", "prove", "--only", "I10"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all ok" in ok.stdout and "I10 preserved by transfer_done" in ok.stdout
    mod = subprocess.run(
        [sys.executable, "-m", "proofs", "--only", "I3"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mod.returncode == 0 and "I3 preserved by expire" in mod.stdout
    none = subprocess.run(
        [sys.executable, "-m", "proofs", "--only", "I99"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert none.returncode == 2


def test_cli_prove_fails_on_a_broken_rule(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rules, "renew_rule", _assigning_renewal)
    assert cli.main(["prove", "--only", "I1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL [lease] I1 holds across renew" in out
    assert "step property I1 fails on transition renew" in out
    assert "before: " in out and "after:  " in out  # the counterexample is printed


# -- mutations: patch a rule in memory, the proofs must fail naming the invariant ----------
# The runtime and the proofs both call rules.renew_rule; renew_applies and
# renew_deadline are its halves. Patching renew_rule breaks both at once.
def _assigning_renewal(
    state: Any, deadline: Any, cap_at: Any, now: Any, extension: Any
) -> tuple[Any, Any]:
    applies = conj(state == rules.GRANTED, now < deadline)
    target = now + extension if cap_at is None else vmin(now + extension, cap_at)
    return applies, ite(applies, target, deadline)


def _uncapped_renewal(
    state: Any, deadline: Any, cap_at: Any, now: Any, extension: Any
) -> tuple[Any, Any]:
    applies = conj(state == rules.GRANTED, now < deadline)
    return applies, ite(applies, vmax(deadline, now + extension), deadline)


def _renewal_ignoring_state(
    state: Any, deadline: Any, cap_at: Any, now: Any, extension: Any
) -> tuple[Any, Any]:
    applies = now < deadline
    target = now + extension if cap_at is None else vmin(now + extension, cap_at)
    return applies, ite(applies, vmax(deadline, target), deadline)


def _revive(mp: pytest.MonkeyPatch) -> None:
    mp.setitem(
        TRANSITIONS,
        (LeaseState.EXPIRED, Input.RECV_HEARTBEAT),
        Transition(LeaseState.GRANTED, Guard.LIVE, "revive"),
    )
    mp.setattr(rules, "renew_rule", _renewal_ignoring_state)


MUTATIONS: dict[str, tuple[Any, str, str]] = {
    "renewal assigns instead of max": (
        lambda mp: mp.setattr(rules, "renew_rule", _assigning_renewal),
        "I1",
        "I1 holds across renew",
    ),
    "renewal revives an ended lease": (_revive, "I2", "I2 holds across renew"),
    "renewal applies to ended leases": (
        lambda mp: mp.setattr(rules, "renew_rule", _renewal_ignoring_state),
        "I2",
        "I2 holds across renew",
    ),
    "expire uses < instead of <=": (
        lambda mp: mp.setattr(
            rules,
            "expire_due",
            lambda state, deadline, now: conj(state == rules.GRANTED, deadline < now),
        ),
        "I4",
        "I4 preserved by expire",
    ),
    "expire ignores the deadline": (
        lambda mp: mp.setattr(
            rules, "expire_due", lambda state, deadline, now: state == rules.GRANTED
        ),
        "I12",
        "I12 preserved by expire",
    ),
    "grant doubles the ttl": (
        lambda mp: mp.setattr(rules, "grant_deadline", lambda now, ttl: now + 2 * ttl),
        "I5",
        "I5 preserved by grant",
    ),
    "renewal ignores the cap": (
        lambda mp: mp.setattr(rules, "renew_rule", _uncapped_renewal),
        "I7",
        "I7 preserved by renew",
    ),
    "transfer completes one notification early": (
        lambda mp: mp.setattr(
            rules, "transfer_is_last", lambda done, consumers: done + 2 >= consumers
        ),
        "I10",
        "I10 preserved by transfer_done",
    ),
    "transfer never counts": (
        lambda mp: mp.setattr(rules, "transfer_done_count", lambda state, done: done),
        "I10",
        "I10 preserved by transfer_done",
    ),
    "heartbeat due only after the interval": (
        lambda mp: mp.setattr(
            rules, "heartbeat_due", lambda last, now, interval: now - last > interval
        ),
        "I11",
        "I11 preserved by step",
    ),
    "read gate ignores the uncertainty": (
        lambda mp: mp.setattr(
            rules, "read_allowed", lambda d, now, off, unc, margin: now + margin < d - off
        ),
        "I9",
        "I9 admitted read is before the peer's deadline",
    ),
    "an ended lease's transfer-done is answered OK": (
        lambda mp: mp.setattr(rules, "transfer_verdict_ok", lambda state: state != rules.ABSENT),
        "I13",
        "I13 preserved by p_td",
    ),
    "a partial count is answered NK": (
        lambda mp: mp.setattr(
            rules, "transfer_verdict_ok", lambda state: conj(state == rules.GRANTED, False)
        ),
        "I13",
        "I13 holds across p_td",
    ),
    "read gate does not age the sample": (
        lambda mp: mp.setattr(rules, "aged_uncertainty", lambda unc, age, rho: unc),
        "I9",
        "I9 gate drift",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_broken_rule_fails_the_proofs_naming_the_invariant(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    patch, iid, label = MUTATIONS[name]  # sound before: test_every_obligation_is_ok
    patch(monkeypatch)
    system = {"I7": "lease-cap", "I9": "gate", "I11": "engine", "I13": "timing-reads"}.get(
        iid, "lease"
    )
    status, out = run_check(only=iid, system=system)
    assert status == 1
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL [")]
    assert any(label in ln for ln in fails), out
    assert re.search(rf"(invariant|step property|theorem) {iid}\b", out), out


def test_an_unreachable_transition_fails_the_vacuity_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(TRANSITIONS, (LeaseState.ABSENT, Input.GRANT))
    status, out = run_check(only="I3", system="lease")
    assert status == 1
    assert re.search(r"^FAIL \[lease\] grant enabled", out, re.M)
    assert "proofs would be vacuous" in out


def test_timing_needs_t2(monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseproto.proofs import timing_model

    monkeypatch.setattr(timing_model, "t2", lambda p: p.E > 0)
    status, out = run_check(only="I8", system="timing")
    assert status == 1
    assert "FAIL [timing] L7 preserved by p_recv" in out


def test_a_patched_rule_the_runtime_s_loop_does_not_follow_fails_L14(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The models call the rule; the runtime runs its renew loop, written beside the
    rule and tied to it by L14 (the loop run on z3 terms). A rule patched in memory
    changes the models, not the loop: L14 then fails, so what is proven about the rule
    is proven about the loop only while they agree."""
    from leaseproto import LeaseTable

    monkeypatch.setattr(rules, "renew_rule", _assigning_renewal)
    t = LeaseTable()
    t.grant("a", now=0.0)
    t.renew(["a"], now=5.0)
    assert t.deadline("a") == 30.0  # max(30, 25): the loop, not the patched rule
    status, out = run_check(system="loops")
    assert status == 1
    assert "FAIL [loops] L14 renew loops = renew_rule, renew_lost (uncapped, real)" in out, out


def test_deleting_the_granted_abort_row_fails_an_obligation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # before: "abort enabled" was met from an already-aborted lease, and the missing
    # row read as "state unchanged", so every obligation passed
    monkeypatch.delitem(TRANSITIONS, (LeaseState.GRANTED, Input.RECV_ABORT))
    status, out = run_check(system="lease")
    assert status == 1
    assert re.search(r"^FAIL \[lease\] abort enabled", out, re.M), out
    assert re.search(r"^FAIL \[lease\] L0 preserved by abort", out, re.M), out


LEASE_INPUTS = {
    Input.GRANT: "grant",
    Input.RECV_HEARTBEAT: "renew",
    Input.RECV_TRANSFER_DONE: "transfer_done",
    Input.RECV_ABORT: "abort",
    Input.TIMER_EXPIRE: "expire",
}


@pytest.mark.parametrize(
    "row",
    sorted(TRANSITIONS, key=lambda k: (k[0], k[1].value)),
    ids=lambda r: f"{r[0].name}-{r[1].name}",
)
def test_every_deleted_row_fails_an_obligation_of_its_transition(
    row: tuple[LeaseState, Input], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(TRANSITIONS, row)
    obs = check.select(check.all_obligations("lease"), None, "lease")
    name = LEASE_INPUTS[row[1]]
    mine = [o for o in obs if o.label.split(" ")[-1] == name or o.label == f"{name} enabled"]
    solver.configure()
    failed = [o.label for o in mine if not solver.solve(o).ok]
    assert failed, f"deleting {row} fails no obligation of {name}"


def test_the_proofs_do_not_depend_on_the_order_of_the_transition_table() -> None:
    """``next_state``'s ite chain once took the table's last row as its default,
    untested: a value that is no state then followed that row, and the timing
    proofs passed or failed with the dict's order (a test that deleted and
    restored a row moved it last, and ``L4 preserved by p_step`` failed after it).
    Here that row is moved last on purpose."""
    saved = list(TRANSITIONS.items())
    key = (LeaseState.GRANTED, Input.TIMER_EXPIRE)
    items = [kv for kv in saved if kv[0] != key] + [(key, TRANSITIONS[key])]
    try:
        TRANSITIONS.clear()
        TRANSITIONS.update(items)
        status, out = run_check()
    finally:
        TRANSITIONS.clear()
        TRANSITIONS.update(saved)
    assert status == 0, "\n".join(ln for ln in out.splitlines() if ln.startswith("FAIL"))
