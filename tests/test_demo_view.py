"""What ``leaseproto demo`` draws, read back from an 80-column terminal screen
(``pyte``): the live status shows the surge's telling figures (``expired N
late N``) first, and no line breaks between a number and its unit. The view
is drawn straight to the emulator, with the demo's own texts; no worker runs
(tests/test_e2e_demo.py runs the whole demo on a pseudo-terminal)."""

from __future__ import annotations

import io
import itertools
import re

import pytest

pyte = pytest.importorskip("pyte")
pytest.importorskip("rich")
pytest.importorskip("zmq")  # leaseproto.demo.run imports the cluster and its client

from leaseproto.demo import run as demo  # noqa: E402
from leaseproto.demo import summary as demo_report  # noqa: E402
from leaseproto.demo.turns import TurnsResult  # noqa: E402
from leaseproto.demo.view import DemoDisplay, surge_status, turns_status, wrap  # noqa: E402

COLUMNS = 80


class _Terminal(io.StringIO):
    """What rich writes to, taken for a terminal (so it draws the live status)."""

    def isatty(self) -> bool:
        return True


def _screen(draw: object, columns: int = COLUMNS) -> list[str]:
    """Run ``draw(display)`` on a terminal of ``columns`` x 24; the lines the
    screen shows then (the live status included: it is not ended)."""
    out = _Terminal()
    view = DemoDisplay(out, width=columns)
    try:
        draw(view)  # type: ignore[operator]
        screen = pyte.Screen(columns, 24)
        screen.set_mode(pyte.modes.LNM)  # a pty's ONLCR: "\n" also returns the carriage
        pyte.Stream(screen).feed(out.getvalue())
        return [ln.rstrip() for ln in screen.display]
    finally:
        view.close()


D_STATS = {"waiting": 14, "running": 2}
P_STATS = {"blocks_held": 112, "table": {"released_expired": 17, "late_transfers": 12}}


@pytest.mark.parametrize("name", ["1 surge", "3 surge"])
def test_surge_status_shows_expired_and_late_in_80_columns(name: str) -> None:
    shown = _screen(lambda v: v.status(name, surge_status(D_STATS, P_STATS), done=20, total=36))
    status = [ln for ln in shown if "answered" in ln]
    assert len(status) == 1, shown  # one line, redrawn in place
    assert status[0].startswith(f"  {name} ") and "20/36 answered" in status[0], status
    # the figures phase 3 exists to show are on the screen, not cut off
    assert "expired 17 late 12" in status[0], status
    assert len(status[0]) <= COLUMNS


def test_surge_status_keeps_every_figure_when_there_is_room() -> None:
    (status,) = [
        ln
        for ln in _screen(lambda v: v.status("1 surge", surge_status(D_STATS, P_STATS)), 132)
        if "answered" in ln
    ]
    assert "expired 17 late 12 | P holds 112 blocks | D waiting 14 running 2" in status


def _breaks_a_unit(lines: list[str]) -> list[tuple[str, str]]:
    return [
        (a, b)
        for a, b in itertools.pairwise(lines)
        if re.search(r"\d$", a) and re.match(r"\s*m?s\b", b)
    ]


def test_kept_lines_never_break_between_a_number_and_its_unit() -> None:
    settings = demo.DemoSettings()
    crash = demo.PhaseResult("2 D SIGKILL", "lease", reclaim_s=1.84, reclaim_bound_s=2.5)
    surge = demo.PhaseResult(
        "3 surge", "fixed", requests=36, identical=20, longest_wait_s=9.4, leases_expired=17
    )

    def draw(v: DemoDisplay) -> None:
        v.line(demo_report.header(settings))
        v.verdict(demo_report.verdict(crash, settings))
        v.verdict(demo_report.verdict(surge, settings))

    shown = [ln for ln in _screen(draw) if ln]
    assert shown[0].startswith("leaseproto demo: kv_lease_duration 3 s"), shown
    # before the fix the header read "... lease extension 2" / "s, device cpu"
    assert any("2 s, device cpu" in ln for ln in shown), shown
    assert not _breaks_a_unit(shown), shown
    assert all(len(ln) <= COLUMNS for ln in shown)
    assert sum(ln.startswith("  -> ") for ln in shown) == 2


def test_wrap_keeps_units_and_indents_continuations() -> None:
    text = "  2 D SIGKILL: " + ", ".join(f"figure {i} took {i}.25 s" for i in range(12))
    lines = wrap(text, 40)
    assert len(lines) > 3 and all(len(ln) <= 40 for ln in lines)
    assert all(ln.startswith("  ") for ln in lines)
    assert not _breaks_a_unit(lines)
    assert " ".join(ln.strip() for ln in lines) == text.strip()
    assert wrap("", 80) == [""] and wrap("a\nb", 80) == ["a", "b"]


def _turns() -> list[TurnsResult]:
    common = {"conversations": 12, "ttl_s": 2.0, "stall_s": 3.0, "reached_s": [3.1, 13.25]}
    ours = TurnsResult(
        "4 turns", "verified", identical=12, verified=11, recomputed={"nack": 1},
        heartbeats=1234, kept=11, expired_stalled=1, nk=1,
        stalled="prefix recomputed (nack), output identical to the reference", **common,
    )  # fmt: skip
    vllm = TurnsResult(
        "5 turns", "gate-only", identical=11, differing=1, unverified=1,
        recomputed={"gate": 11}, expired_waiting=11, expired_stalled=1, violations_i14=1,
        stalled="prefix used as read, output DIFFERENT from the reference", **common,
    )  # fmt: skip
    return [ours, vllm]


def test_turns_status_shows_d_s_cached_turns_first_in_80_columns() -> None:
    d = {"turn_leases_live": 12, "turn_table": {"released_expired": 11}, "waiting": 30}
    p = {"queued": 11, "prefix_heartbeats_sent": 1234}
    shown = _screen(lambda v: v.status("5 turns", turns_status(d, p), done=13, total=31))
    status = [ln for ln in shown if "done |" in ln]
    assert len(status) == 1 and len(status[0]) <= COLUMNS, shown
    assert "13/31 done | D turns 12 held 11 expired" in status[0], status


def test_the_turns_table_and_verdicts_fit_80_columns_uncut() -> None:
    results = _turns()

    def draw(v: DemoDisplay) -> None:
        for r in results:
            v.verdict(demo_report.turns_verdict(r))
        v.table(*demo_report.turns_table(results))

    shown = [ln for ln in _screen(draw) if ln]
    assert all(len(ln) <= COLUMNS for ln in shown), shown
    assert not _breaks_a_unit(shown), shown
    assert not any("\u2026" in ln for ln in shown), shown  # no cell cut to fit
    rows = [ln.split() for ln in shown if ln.startswith(("4 turns", "5 turns"))]
    assert rows == [
        ["4", "turns", "verified", "12/12", "11", "0", "1", "11", "0", "0"],
        ["5", "turns", "gate-only", "11/12", "0", "1", "11", "0", "11", "1"],
    ], shown
