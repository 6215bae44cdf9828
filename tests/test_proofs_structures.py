"""L15 (proofs/structures.py): the real LeaseTable run on z3 terms fails an obligation
when its behaviour changes, not only when it crashes."""

from __future__ import annotations

import pytest

pytest.importorskip("z3")

from leaseproto.core import table as table_mod
from proofs import structures


def _failing(only: str = "") -> list[str]:
    import z3

    out = []
    for label, chk in structures.checks(only):
        s = z3.Solver()
        s.add(*chk.hyps, z3.Or(False, *(f for _, f in chk.bad)))
        if chk.error or s.check() != z3.unsat:
            out.append(label)
    return out


def test_the_table_agrees_with_the_naive_model() -> None:
    assert _failing("reorder") == []


def test_a_reaper_that_expires_at_the_deadline_exclusive_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def late(state: int, deadline: float, now: float) -> int | None:
        if state == table_mod.R.GRANTED and deadline < now:
            return table_mod.R.EXPIRED
        return None

    monkeypatch.setattr(table_mod, "expire_end", late)
    assert _failing("grant, renew, expire")


def test_staged_readers_ignored_at_grant_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The seeded bug of issue 20 that only the hypothesis machine caught: a staged
    transfer-done's ``n`` ignored, the granted consumers used instead."""
    real = table_mod.LeaseTable._stage

    def stage(self: table_mod.LeaseTable, req_id: str, now: float, **kw: object) -> None:
        kw.pop("readers", None)
        real(self, req_id, now, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(table_mod.LeaseTable, "_stage", stage)
    assert _failing("staged transfer-done with n")


def test_a_failure_from_a_raise_counts_as_a_crash() -> None:
    """The mutation run's proofs layer tells a failed obligation from a crash by
    ``solver.LAST_RUN`` (tools/mutation_layers.py)."""
    import io

    import z3

    from proofs import solver

    crash = solver.Obligation("s", "raised", (), "unsat", [z3.BoolVal(True)], crashed=True)
    wrong = solver.Obligation("s", "refuted", (), "unsat", [z3.BoolVal(True)])
    assert solver.discharge([crash], io.StringIO()) == 1
    assert solver.LAST_RUN == {"failed": 1, "crashed": 1, "unknown": 0}
    assert solver.discharge([crash, wrong], io.StringIO()) == 2
    assert solver.LAST_RUN == {"failed": 2, "crashed": 1, "unknown": 0}
