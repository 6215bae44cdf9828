"""The lease-table system of the proofs (proofs/table_model.py): the heap with
lazy requeue, tombstones and staging over several ids. Breaking a piece of the
algorithm or a rule in memory makes ``leaseproto prove`` fail naming the
invariant; and the proofs evaluate the runtime's concrete branch of
``next_state`` too."""

from __future__ import annotations

import re
from typing import Any

import pytest
import z3
from leaseproto.proofs import check, table_invariants, table_model, table_parts
from test_proofs import run_check

from leaseproto.core import rules
from leaseproto.core.state import TRANSITIONS, Input, LeaseState
from leaseproto.core.sym import conj


def fails(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("FAIL [")]


def test_the_table_system_has_its_obligations_and_each_transition_a_witness() -> None:
    obs = [o for o in check.all_obligations("table") if o.system == "table"]
    ids = {i for o in obs for i in o.ids}
    assert {"I2", "I3", "I4", "I10", "I12", "I13", "L11", "L12", "L13"} <= ids
    sys_ = table_model.table_system()
    enabled = {o.label for o in obs if o.label.endswith(" enabled")}
    assert enabled == {f"{t.name} enabled" for t in sys_.transitions}
    assert all(t.witness is not None for t in sys_.transitions)
    inv_ids = {i.id for i in table_invariants.INVARIANTS}
    assert inv_ids == ids


def _newest_dropped(s: Any, k: int, cap: Any) -> Any:
    g, n = table_model.g, table_model.N
    older = [z3.And(g(s, "tomb", j), g(s, "eord", j) < g(s, "eord", k)) for j in range(n) if j != k]
    return z3.And(g(s, "tomb", k), table_model.count(older) < cap)


TABLE_MUTATIONS: dict[str, tuple[Any, str, str]] = {
    "renewed heap entry requeued 1 s late": (
        lambda mp: mp.setattr(table_model, "requeue_key", lambda deadline: deadline + 1),
        "L11",
        "L11 preserved by expire_requeue",
    ),
    "tombstone eviction drops the newest": (
        lambda mp: mp.setattr(table_parts, "tomb_kept", _newest_dropped),
        "L12",
        "L12.2 preserved by abort_live",
    ),
    "expire uses < instead of <= (the loop never ends)": (
        lambda mp: mp.setattr(
            rules,
            "expire_due",
            lambda state, deadline, now: conj(state == rules.GRANTED, deadline < now),
        ),
        "I4",
        "I4 holds across expire_release",
    ),
    "deleted (GRANTED, timer_expire) row": (
        lambda mp: mp.delitem(TRANSITIONS, (LeaseState.GRANTED, Input.TIMER_EXPIRE)),
        "L0",
        "expire_release enabled",
    ),
    "deleted (GRANTED, recv_abort) row": (
        lambda mp: mp.delitem(TRANSITIONS, (LeaseState.GRANTED, Input.RECV_ABORT)),
        "L0",
        "abort_live enabled",
    ),
    "staged transfer-dones counted against the granted consumers": (
        lambda mp: mp.setattr(
            rules, "transfer_is_last", lambda done, consumers: done + 1 >= consumers + 1
        ),
        "I10",
        "I10 preserved by grant",
    ),
}


@pytest.mark.parametrize("name", sorted(TABLE_MUTATIONS))
def test_a_broken_table_algorithm_fails_the_proofs_naming_the_invariant(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    patch, iid, label = TABLE_MUTATIONS[name]  # sound before: test_every_obligation_is_ok
    patch(monkeypatch)
    status, out = run_check(only=iid, system="table")
    assert status == 1, out
    assert any(label in ln for ln in fails(out)), out


def test_the_concrete_branch_of_next_state_is_proven_equal_to_the_symbolic_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Break only the runtime's branch (the table lookup on an int state): every
    model still sees the right ite chain, and the proofs still fail, naming L0."""
    real = rules.next_state

    def lookup_ignores_aborts(state: Any, inp: Input, guard: Any) -> Any:
        if isinstance(state, int) and inp is Input.RECV_ABORT:
            return state
        return real(state, inp, guard)

    monkeypatch.setattr(rules, "next_state", lookup_ignores_aborts)
    status, out = run_check(only="L0", system="lease")
    assert status == 1
    bad = fails(out)
    assert any("L0 next_state(st, recv_abort) symbolic = concrete lookup" in ln for ln in bad), out
    assert len(bad) == 1, out  # only the concrete branch changed
    assert re.search(r"differ on recv_abort", out), out
