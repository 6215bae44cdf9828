"""The lease in the other direction (spec §2.8): I14-I16 proven, naive variants refuted."""

from __future__ import annotations

import io
from typing import Any

import pytest
from leaseproto.proofs import check, solver, timing_turn2

from leaseproto.core import rules


def _run(system: str, only: str | None = None) -> tuple[int, str]:
    buf = io.StringIO()
    status = check.run(only=only, out=buf, system=system)
    return status, buf.getvalue()


@pytest.mark.parametrize("system", ["turn2", "push"])
def test_turn2_and_push_obligations_hold(system: str) -> None:
    status, out = _run(system)
    assert status == 0, out
    labels = [ln for ln in out.splitlines() if ln.startswith("ok")]
    assert len(labels) == {"turn2": 7, "push": 5}[system], out


def test_each_new_id_is_proven_not_only_witnessed(every_obligation: list[Any]) -> None:
    obs = every_obligation
    for iid in ("I14", "I15", "I16"):
        assert any(ob.expect == "unsat" and iid in ob.ids for ob in obs), iid
    refuted = {ob.label for ob in obs if ob.label.endswith(" refuted")}
    assert refuted == {"I14 turn2 gate-only refuted", "I15 push watchdog-only refuted"}


def test_a_verdict_that_ignores_the_lease_fails_the_fence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "transfer_verdict_ok", lambda state: True)
    status, out = _run("turn2", only="I14")
    assert status == 1
    assert "FAIL [turn2] I14 turn2 fence" in out


def test_a_renewal_that_ignores_expiry_order_fails_i16(monkeypatch: pytest.MonkeyPatch) -> None:
    # a renewal that does not extend (assigns the old deadline) lets the cached lease lapse
    monkeypatch.setattr(
        rules, "renew_deadline", lambda state, deadline, cap_at, now, extension: deadline
    )
    status, out = _run("turn2", only="I16")
    assert status == 1
    assert "FAIL [turn2] I16 turn2 steady state" in out


def test_the_naive_refutation_fails_when_the_variant_is_made_safe() -> None:
    # the gate-only theorem is refuted only because P may pause after the gate: bound
    # the pause and the read by zero and the "counterexample" obligation must fail
    import z3

    th = timing_turn2.naive_refutations()[0]
    pause, rd = z3.Reals("pause read_s")
    safe = check.refutation_obligations(
        [
            type(th)(
                th.id,
                th.system,
                th.name,
                th.text,
                z3.And(th.hyps, pause == 0, rd == 0),
                th.goal,
                th.show,
            )
        ]
    )
    assert not solver.solve(safe[0]).ok
