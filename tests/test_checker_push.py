"""The model checker's push scope (spec §2.8, I15, I16): D's registration lease in
its real LeaseTable, P's real HeartbeatTracker on its own drifting clock, D's use
and quarantine decisions by the real PushRegistrations. Each check is shown
failing on a mutant of the real code (a registry, verdict or renewal that does
the wrong thing), and each new check of ``checker/push_checks.py`` is shown to
be what catches its mutant: with the check removed, the mutant passes."""

from __future__ import annotations

from typing import Any

import pytest
from test_checker import mutate
from test_checker_checks import _grant_past_ttl, _short, assert_caught

from leaseproto.checker import SCOPES, check, push_checks
from leaseproto.checker.explore import OK
from leaseproto.checker.scope import QUICK
from leaseproto.core import rules, wire
from leaseproto.core.push import PushRegistrations

PUSH = SCOPES["push"]
#: push with one fault at a time, and with two writers, each run whole
PAUSE, CRASH, CANCEL, ABORT, W2 = (
    QUICK[f"push-{name}"] for name in ("pause", "crash", "cancel", "abort", "w2")
)


def _registry(old: str, new: str, method: str = "completion", count: int = 1) -> Any:
    return lambda mp: mutate(mp, PushRegistrations, method, old, new, count=count)


#: name -> (apply the mutant, scope, the invariant the checker names)
MUTANTS: dict[str, tuple[Any, Any, str]] = {
    # the fence: D uses pushed KV only on OK for every writer's completion
    # (ignoring the NK alone changes nothing: the lapse has discarded the KV already)
    "D ignores its own NK and the lapse": (
        lambda mp: (
            _registry("if ok and not reg.failed:", "if not reg.failed:")(mp),
            _registry("return self._fail(lease_id, reg)", "return IGNORE", "ended")(mp),
        ),
        PAUSE,
        "I15",
    ),
    "D uses the pushed KV after one of two writers": (
        _registry("        if reg.owed:\n            return WAIT\n", ""),
        W2,
        "I15",
    ),
    "D answers OK whatever its registration (the verdict)": (
        lambda mp: mp.setattr(wire, "verdict", lambda r, res: wire.Ok(r)),
        PAUSE,
        "I15",
    ),
    # the quarantine
    "a lapsed registration's blocks freed at the lapse (watchdog-only)": (
        _registry("if reg.ended and not reg.owed:", "if reg.ended:", "_fail"),
        PAUSE,
        "I15",
    ),
    "a cancelled registration's blocks freed at once": (
        _registry("if reg.ended and not reg.owed:", "if reg.ended:", "_fail"),
        CANCEL,
        "I15",
    ),
    # its bound (B9)
    "an abort that does not settle its writer": (
        _registry("reg.owed.discard(writer)", "pass", "abort"),
        ABORT,
        "I15",
    ),
    "forgetting a dead writer that does not settle it": (
        _registry("reg.owed.discard(agent)", "pass", "forget"),
        CRASH,
        "I15",
    ),
    # I16: P's heartbeats keep the registration (T2' on P's drifting clock)
    "a renewal of the registration half a tick short": (_short, PAUSE, "I16"),
    "the registration granted a tick past its ttl": (
        _grant_past_ttl,
        PAUSE,
        "I16",
    ),
    # P's clock advances 3/4 a tick: a heartbeat due one of P's steps late is missed
    "P heartbeating one of its steps late, on its own clock": (
        lambda mp: mp.setattr(
            rules, "heartbeat_due", lambda last, now, iv: now - last >= iv + 0.75
        ),
        PAUSE,
        "I16",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_push_mutant_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_caught(name, MUTANTS[name], monkeypatch)


@pytest.mark.parametrize("scope", [PAUSE, CRASH, CANCEL, ABORT, W2])
def test_the_real_code_passes_each_fault_whole(scope: Any) -> None:
    res = check(scope)
    assert res.verdict == OK and not res.bounded, res.summary()


def _off(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    for name in names:
        monkeypatch.setattr(push_checks, name, lambda *a, **kw: None)


#: mutant -> the checks of push_checks that catch it: with all of them removed it passes
CAUGHT_BY: dict[str, tuple[str, ...]] = {
    # (ignoring the NK alone changes nothing: the lapse has discarded the KV already)
    "D ignores its own NK and the lapse": ("check_decision",),
    "D uses the pushed KV after one of two writers": ("check_decision",),
    "a lapsed registration's blocks freed at the lapse (watchdog-only)": (
        "check_free",
        "check_landing",
    ),
    "an abort that does not settle its writer": ("check_quarantine_bounded",),
    "forgetting a dead writer that does not settle it": ("check_quarantine_bounded",),
}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_the_mutant_passes_without_the_checks_that_catch_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply, scope, _ = MUTANTS[name]
    apply(monkeypatch)
    _off(monkeypatch, *CAUGHT_BY[name])
    res = check(scope)
    assert res.ok, res.summary()


def test_the_watchdog_only_design_lands_a_late_write_in_reused_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stock watchdog's schedule, as the checker finds it when only the ground
    truth is checked (not the rule's statement): P pauses past the registration,
    D frees and reuses the blocks at the lapse, P's WRITE lands in them."""
    MUTANTS["a lapsed registration's blocks freed at the lapse (watchdog-only)"][0](monkeypatch)
    _off(monkeypatch, "check_free")
    res = check(PAUSE)
    assert res.violation is not None and res.violation.inv == "I15", res.summary()
    assert "landed in" in res.violation.text and "after D0 handed them" in res.violation.text
    steps = " ".join(res.trace)
    assert "d_pause" in steps and "write r0 P0 D0" in steps, res.summary()


def test_the_checker_drives_the_registry_and_the_quarantine_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The push world calls the real PushRegistrations (a spy counts the calls), and
    in the pause scope some lapsed registration is quarantined and settled later by
    P's late completion, and some pushed KV is used."""
    calls: dict[str, int] = {}
    for name in ("register", "completion", "ended", "take_free", "quarantined"):
        orig = getattr(PushRegistrations, name)

        def spy(self: Any, *a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            out = _orig(self, *a, **kw)
            if _name != "quarantined" or out:
                calls[_name] = calls.get(_name, 0) + 1
            return out

        monkeypatch.setattr(PushRegistrations, name, spy)
    uses: list[str] = []
    orig_decision = push_checks.check_decision

    def decision(w: Any, p: str, r: str, act: str) -> None:
        uses.append(act)
        orig_decision(w, p, r, act)

    monkeypatch.setattr(push_checks, "check_decision", decision)
    res = check(PAUSE)
    assert res.ok, res.summary()
    assert set(calls) == {"register", "completion", "ended", "take_free", "quarantined"}, calls
    assert {"use", "discard"} <= set(uses)


def test_the_push_scope_keeps_its_assumptions() -> None:
    with pytest.raises(ValueError, match="push"):
        PUSH.with_(mirror=False)
    with pytest.raises(ValueError, match="A5"):
        PUSH.with_(d_rate=0.5)  # below (1 - rho) / (1 + rho) = 0.6
    assert PUSH.max_states > 93_202  # as typed, exhaustive (docs/verification.md)
