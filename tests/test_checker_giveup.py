"""The router's give-up rule (``leaseproto/workers/giveup.py``) and I17, which
the model checker judges it by (scope ``giveup``): the rule's table, its refusal
of a cause it has no row for, and each wrong rule caught by I17 alone (with the
check gone, the leases it leaves behind lapse by I5 and nothing else fails)."""

from __future__ import annotations

import pytest
from leaseproto.proofs import solver
from leaseproto.proofs.code_runs import giveup_obligations
from test_checker import mutate

from leaseproto.checker import INVARIANTS, SCOPES, check, giveups
from leaseproto.checker.explore import OK, VIOLATION
from leaseproto.checker.scope import QUICK
from leaseproto.workers import giveup
from leaseproto.workers.giveup import CAUSES, GiveUp, give_up


@pytest.mark.parametrize(
    ("cause", "stage", "rank", "want"),
    [
        ("unsent", "prefill", None, GiveUp((0, 1, 2), decode=False)),
        ("rank_failed", "prefill", 1, GiveUp((0, 2), decode=False)),
        ("lost", "prefill", 2, GiveUp((0, 1), decode=False)),
        ("decode_unreachable", "prefill", None, GiveUp((0, 1, 2), decode=False)),
        ("decode_failed", "decode", None, GiveUp((0, 1, 2), decode=False)),
        ("lost", "decode", None, GiveUp((), decode=False)),
        ("timeout", "prefill", None, GiveUp((0, 1, 2), decode=False)),
        ("timeout", "decode", None, GiveUp((0, 1, 2), decode=True)),
    ],
)
def test_the_rule_names_whom_to_tell(
    cause: str, stage: str, rank: int | None, want: GiveUp
) -> None:
    assert give_up(cause, stage=stage, p_ranks=3, rank=rank) == want


@pytest.mark.parametrize(
    ("cause", "stage", "rank"),
    [
        ("bored", "prefill", None),  # no such cause
        ("decode_failed", "prefill", None),  # D has not answered in prefill
        ("unsent", "decode", None),
        ("rank_failed", "prefill", None),  # which rank?
        ("rank_failed", "prefill", 3),  # not a rank of 3
        ("timeout", "decode", 0),  # a timeout names no rank
        ("lost", "decode", 1),  # lost in decode is D's connection
    ],
)
def test_the_rule_refuses_what_it_has_no_row_for(cause: str, stage: str, rank: int | None) -> None:
    with pytest.raises(ValueError, match=r"cause|stage|rank"):
        give_up(cause, stage=stage, p_ranks=3, rank=rank)


def test_every_cause_has_a_row() -> None:
    rows = {c: [s for s in ("prefill", "decode") if s in giveup._STAGES[c]] for c in CAUSES}
    assert all(rows.values()) and set(rows) == set(giveup._STAGES)


def test_the_router_sends_what_the_rule_names() -> None:
    """``Router._give_up`` is the rule plus the sends; no abort of its own."""
    from leaseproto.workers.router import Router

    class FakePeer:
        def __init__(self) -> None:
            self.sent: list[dict[str, object]] = []

        def send(self, msg: dict[str, object]) -> bool:
            self.sent.append(msg)
            return True

    class Pending:
        req_id = "c-0123456789abcdef"
        stage = "decode"

    r = Router.__new__(Router)
    r.prefill = [FakePeer(), FakePeer()]  # type: ignore[list-item]
    r.decode = FakePeer()  # type: ignore[assignment]
    r._give_up(Pending(), "timeout")  # type: ignore[arg-type]
    abort = {"op": "abort", "req_id": Pending.req_id}
    assert [p.sent for p in r.prefill] == [[abort], [abort]]  # type: ignore[attr-defined]
    assert r.decode.sent == [abort]  # type: ignore[attr-defined]
    Pending.stage = "prefill"
    r._give_up(Pending(), "rank_failed", rank=0)  # type: ignore[arg-type]
    assert [len(p.sent) for p in r.prefill] == [1, 2]  # type: ignore[attr-defined]
    assert len(r.decode.sent) == 1  # type: ignore[attr-defined]


#: name -> (the line of ``give_up`` replaced, its replacement)
WRONG_RULES = {
    "a timeout in decode does not tell D": (
        'decode=cause == "timeout" and stage == "decode"',
        "decode=False",
    ),
    "the other rank left out instead of the failed one": (
        "if i != rank",
        "if rank is None or i != 1 - rank",
    ),
    "D unreachable: no P rank told": (
        '    if cause == "lost" and stage == "decode":',
        '    if cause == "decode_unreachable" or (cause == "lost" and stage == "decode"):',
    ),
    "a timeout tells no P rank": (
        '    if cause == "lost" and stage == "decode":',
        '    if cause == "timeout" or (cause == "lost" and stage == "decode"):',
    ),
    "D failed it: no P rank told": (
        '    if cause == "lost" and stage == "decode":',
        '    if cause == "decode_failed" or (cause == "lost" and stage == "decode"):',
    ),
    "a refused prefill tells no P rank": (
        '    if cause == "lost" and stage == "decode":',
        '    if cause == "unsent" or (cause == "lost" and stage == "decode"):',
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG_RULES))
def test_each_wrong_rule_is_caught_by_i17(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    scope = QUICK["giveup"]
    assert check(scope).verdict == OK  # the rule as written passes the same scope
    old, new = WRONG_RULES[name]
    mutate(monkeypatch, giveup, "give_up", old, new)
    res = check(scope)
    assert res.verdict == VIOLATION, f"{name}: not caught ({res.summary()})"
    assert res.violation is not None and res.violation.inv == "I17", res.summary()
    assert "I17" in INVARIANTS
    # without the check, nothing else notices: the leases left behind lapse (I5)
    monkeypatch.setattr(giveups, "check_p", lambda w, p: None)
    monkeypatch.setattr(giveups, "check_d", lambda w: None)
    assert check(scope).verdict == OK, name


def test_the_router_scope_is_off_elsewhere() -> None:
    """Only ``giveup`` lets the router give up: the other scopes' state counts stand."""
    assert [n for n, s in SCOPES.items() if s.router] == ["giveup"]


def _l20_holds() -> bool:
    (ob,) = giveup_obligations()
    return bool(solver.solve(ob).ok)


def test_l20_the_rule_equals_the_spec_s_table() -> None:
    assert _l20_holds()


@pytest.mark.parametrize(
    "wrong",
    [
        *WRONG_RULES.values(),
        # a rank the rule should refuse as misuse, accepted
        ("not 0 <= rank < p_ranks", "not -1 <= rank < p_ranks"),
        # telling the failed rank too (harmless, so the checker passes it; L20 does not)
        ("if i != rank", "if True"),
    ],
)
def test_l20_fails_on_a_wrong_rule(wrong: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, giveup, "give_up", *wrong)
    assert not _l20_holds()
