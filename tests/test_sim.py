"""The fleet simulator: small deterministic runs checked against the timing rules.

Symbols as in the spec: H heartbeat_interval, E lease_extension, L initial
lease, C cap, S_P P's step, S_D the longest gap between D steps, δ the
notification delay bound.
"""

from __future__ import annotations

import gc
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from leaseproto import LeaseConfig, ReleaseReason
from leaseproto.cli import main
from leaseproto.sim import (
    Comparison,
    Crash,
    Hang,
    Policy,
    Scenario,
    Surge,
    compare,
    default_policies,
    generate,
    preset,
)
from leaseproto.sim.engines import DEngine
from leaseproto.sim.fleet import FleetRun

CFG = LeaseConfig()
H, E, L = CFG.heartbeat_interval, CFG.lease_extension, CFG.kv_lease_duration
EPS = 1e-9

# A D crash in the middle of a surge: D's queue holds requests that waited well past
# L - E, so their deadlines were set by renewals. Short, so the suite stays fast.
CRASH = preset("both", duration=300.0)
# A surge long enough that D's queue wait exceeds the 30 s initial lease many times over.
SURGE = preset("surge", duration=400.0, surges=(Surge(start=60.0, length=120.0, rate=3.0),))


def _by_name(comp: Comparison) -> dict[str, FleetRun]:
    return {run.policy.name: run for run in comp.runs}


@pytest.fixture(scope="module")
def crash() -> dict[str, FleetRun]:
    return _by_name(compare(CRASH, seed=3))


@pytest.fixture(scope="module")
def surge() -> dict[str, FleetRun]:
    return _by_name(compare(SURGE, seed=5))


def _timing_assumptions_hold(sc: Scenario) -> None:
    # T2 (steady state, no clock drift): H + S_D + δ + S_P < E. Without it the lease
    # policy is allowed to expire tracked requests and the checks below mean nothing.
    assert H + sc.max_stall + sc.max_delay + sc.p_step < E


def test_same_seed_same_figures() -> None:
    a = compare(CRASH, seed=11)
    b = compare(CRASH, seed=11)
    c = compare(CRASH, seed=12)
    timing = ("wall_s", "cpu_s")
    strip = [{k: v for k, v in f.as_dict().items() if k not in timing} for f in a.figures]
    assert strip == [{k: v for k, v in f.as_dict().items() if k not in timing} for f in b.figures]
    assert a.series == b.series
    assert strip != [{k: v for k, v in f.as_dict().items() if k not in timing} for f in c.figures]


def test_every_grant_released_exactly_once(crash: dict[str, FleetRun]) -> None:
    for name, run in crash.items():
        fig = run.fig
        assert fig.granted == fig.requests == len(run.wl), name
        assert all(r is not None for r in run.release_of), name
        assert (
            fig.released_transferred + fig.released_expired + fig.released_aborted == fig.granted
        ), name
        for r in run.release_of:
            assert r is not None
            # P frees on the first step at or after the deadline, never before it.
            if r.reason is ReleaseReason.EXPIRED:
                assert r.deadline <= r.at < r.deadline + run.sc.p_step + EPS, name


def test_lease_crash_to_release_within_bound(crash: dict[str, FleetRun]) -> None:
    run = crash["lease"]
    sc = run.sc
    _timing_assumptions_hold(sc)
    renewed = never = 0
    for i, rel in enumerate(run.release_of):
        died = run.lost_at[i]
        if math.isnan(died):
            continue
        assert rel is not None and rel.reason is ReleaseReason.EXPIRED
        # I6 at P's step granularity: ends by max(granted_at + L, h + E), plus one P step.
        last = rel.last_renewal if rel.last_renewal is not None else -math.inf
        assert rel.at <= max(rel.granted_at + L, last + E) + sc.p_step + EPS
        if rel.deadline > rel.granted_at + L:
            renewed += 1
            # The last renewal set the deadline. D's last heartbeat left at or before
            # its death, took at most δ, and P handled it on its next step: so
            # death -> release <= E + δ + 2 S_P ...
            assert rel.at - died <= E + sc.max_delay + 2 * sc.p_step + EPS
            # ... which is within the bound E + H + one step.
            assert rel.at - died <= E + H + sc.p_step + EPS
        else:
            never += 1
            # The initial lease still rules (never renewed, or renewed early): it ends
            # by granted_at + L, and the grant came at most router_detect after the
            # death (the router's last send to the dead D).
            assert rel.at <= rel.granted_at + L + sc.p_step + EPS
            assert rel.at - died <= L + sc.router_detect + sc.p_step + EPS
    assert renewed >= 10 and never >= 1, "the scenario must strand both kinds"
    assert run.fig.death_to_release_max is not None
    assert run.fig.death_to_release_max <= max(E + H, L + sc.router_detect) + sc.p_step + EPS


def test_fixed_480_holds_dead_blocks_for_its_ttl(crash: dict[str, FleetRun]) -> None:
    fixed, lease = crash["fixed 480s"], crash["lease"]
    assert fixed.fig.stranded == lease.fig.stranded > 0  # same workload, same crash
    for i, rel in enumerate(fixed.release_of):
        if not math.isnan(fixed.lost_at[i]):
            assert rel is not None
            assert rel.granted_at + 480.0 <= rel.at < rel.granted_at + 480.0 + CRASH.p_step + EPS
    assert fixed.fig.stranded_block_s > 10 * lease.fig.stranded_block_s


def test_fixed_30_expires_under_a_long_surge(surge: dict[str, FleetRun]) -> None:
    fig = surge["fixed 30s"].fig
    assert fig.d_wait_p99 is not None and fig.d_wait_p99 > 2 * 30.0
    assert fig.expired_while_needed > 0
    assert fig.late_reads > 0  # those D read later: blocks already freed


def test_lease_never_expires_tracked_requests_under_a_surge(surge: dict[str, FleetRun]) -> None:
    _timing_assumptions_hold(SURGE)
    for name in ("lease", "lease+cap 300s", "fixed 480s"):
        fig = surge[name].fig
        assert fig.stranded == 0  # no crash in this scenario
        assert fig.expired_while_needed == 0, name
        assert fig.released_expired == 0, name
        assert fig.late_reads == 0, name
        assert fig.released_transferred == fig.requests, name
    lease = surge["lease"].fig
    assert lease.renewals > lease.requests  # the waits were bridged by renewals
    assert surge["fixed 30s"].fig.hb_msgs_per_s == 0.0
    assert lease.hb_bytes_per_renewal is not None
    assert lease.hb_bytes_per_renewal > len(surge["lease"].wl.rid[0])


def test_cap_bounds_a_stuck_but_heartbeating_d() -> None:
    sc = preset("hang", duration=300.0, hangs=(Hang(at=30.0, engine=0, length=400.0),))
    cap = 120.0
    pols = [Policy.lease(CFG), Policy.lease(LeaseConfig(max_lease_lifetime=cap), name="cap")]
    runs = _by_name(compare(sc, seed=2, policies=pols))
    held = [r.at - r.granted_at for r in runs["lease"].release_of if r is not None]
    capped = [r.at - r.granted_at for r in runs["cap"].release_of if r is not None]
    assert max(held) > cap + L  # renewals kept the stuck D's blocks
    assert max(capped) <= max(L, cap) + sc.p_step + EPS  # I7
    assert runs["cap"].fig.expired_while_needed > 0  # the price of the cap
    assert runs["lease"].fig.expired_while_needed == 0


def test_small_notifications_split_heartbeats() -> None:
    sc = replace(SURGE, duration=200.0)
    big = compare(sc, seed=1, policies=[Policy.lease(CFG)]).figures[0]
    small = compare(
        sc, seed=1, policies=[Policy.lease(LeaseConfig(max_notification_bytes=128))]
    ).figures[0]
    assert big.hb_ids == small.hb_ids > 0  # D sent the same ids ...
    assert small.hb_msgs_per_s > 2 * big.hb_msgs_per_s  # ... in more, smaller messages
    assert small.hb_bytes_per_s > big.hb_bytes_per_s  # each repeats the prefix


def test_step_boundaries_skip_stalls() -> None:
    d = DEngine(0, 0.01, [(1.0, 3.5), (10.0, 10.2)], [])
    assert d.step_at(0.95, 0.05) == pytest.approx(0.96)
    assert d.step_at(0.98, 0.05) == 3.5  # 1.01 falls inside the stall
    assert d.step_at(1.2, 0.05) == 3.5
    assert d.step_at(10.1, 0.05) == 10.2
    for k in range(2000):
        t = k * 0.00731
        b = d.step_at(t, 0.05)
        assert b >= t
        assert not (1.0 < b < 3.5 or 10.0 < b < 10.2)


@pytest.mark.parametrize("cycle", [False, True])
def test_a_run_leaves_no_cyclic_garbage(monkeypatch: pytest.MonkeyPatch, cycle: bool) -> None:
    # A run turns the cyclic collector off (FleetRun.run): whatever it drops must be freed by
    # reference counting alone, or a long run would keep it. With `cycle`, a handler that
    # leaves a reference cycle behind shows the check sees one.
    if cycle:
        sample = FleetRun._sample

        def leaky(self: FleetRun, t: float, arg: object) -> None:
            loop: list[object] = []
            loop.append(loop)
            sample(self, t, arg)

        monkeypatch.setattr(FleetRun, "_sample", leaky)
    wl = generate(CRASH, 3)
    FleetRun(wl, Policy.lease()).run()
    assert gc.isenabled()  # a run turns the collector back on
    run = FleetRun(wl, Policy.lease())
    gc.collect()
    gc.disable()  # (so that nothing collects the run's garbage before we count it)
    try:
        run.run()
        assert not gc.isenabled()  # a run leaves the collector as it found it
        found = gc.collect()
    finally:
        gc.enable()
    assert found > 0 if cycle else found == 0


def test_presets_and_scale() -> None:
    wl = generate(preset("scale"), 0)
    assert len(wl) >= 10_000 and wl.scenario.duration >= 3600.0
    with pytest.raises(ValueError, match="unknown preset"):
        preset("nope")
    with pytest.raises(ValueError, match="decode engine"):
        replace(CRASH, crashes=(Crash(at=1.0, engine=9),))
    assert [p.name for p in default_policies()] == [
        "fixed 480s",
        "fixed 30s",
        "lease",
        "lease+cap 300s",
    ]


def test_internet_preset_is_a_busy_day_of_a_large_fleet() -> None:
    sc = preset("internet")
    assert sc.p_engines >= 100 and sc.d_engines >= 200 and sc.duration == 24 * 3600.0
    # expected arrivals: the steady rate all day plus the surges
    assert sc.rate * sc.duration + sum(s.rate * s.length for s in sc.surges) >= 1.0e6
    # D's capacity (requests/s the fleet's running slots decode) lies between the
    # steady rate and the peaks' rates: queues form in the peaks, not all day
    decode_mean = sum(sc.output_tokens) / 2 * sc.decode_per_token
    capacity = sc.d_engines * sc.d_slots / decode_mean
    assert sc.rate < 0.7 * capacity
    assert all(sc.rate + s.rate > 0.95 * capacity for s in sc.surges)
    # crashes while D's queues are full: at least two in each peak
    for s in sc.surges:
        assert sum(s.start < c.at < s.start + s.length for c in sc.crashes) >= 2
    assert len({c.engine for c in sc.crashes}) == len(sc.crashes)


def test_cli_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    rc = main(["sim", "--preset", "crash", "--duration", "120", "--no-progress", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "fixed 480s" in text and "lease+cap 300s" in text
    doc = json.loads((out / "figures.json").read_text())
    assert [f["policy"] for f in doc["figures"]] == [
        "fixed 480s",
        "fixed 30s",
        "lease",
        "lease+cap 300s",
    ]
    assert (out / "series.csv").read_text().startswith("policy,t,p_blocks")
    assert main(["sim", "--policies", "fixed:abc", "--no-progress"]) == 2
    assert main(["sim", "--policies", "cap:10", "--no-progress"]) == 2  # C4: cap < lease


def test_cli_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert (
        main(
            [
                "sim",
                "--preset",
                "surge",
                "--duration",
                "60",
                "--no-progress",
                "--json",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_progress_bar_in_80_columns_leaves_no_residue() -> None:
    pytest.importorskip("rich")
    from pty_screen import run_in_pty

    def is_bar(line: str) -> bool:
        return "virtual t=" in line

    code, shown, most, bars = run_in_pty(
        ["sim", "--preset", "both", "--progress"], is_bar, columns=80
    )
    text = "\n".join(shown)
    assert code == 0, text
    assert most == 1, text  # drawn, on one line
    # every redraw is whole: nothing of an earlier, longer one left after it
    for bar in bars:
        assert re.fullmatch(r"\[.+ \d/\d\] .+ +\d+% virtual t=[\d,]+s", bar), bar
    assert not any(is_bar(ln) for ln in shown), text  # and gone
    assert any(ln.startswith("requests ") for ln in shown), text


def test_plot_gives_every_policy_its_own_style_and_the_markers_theirs() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from leaseproto.cli.sim_cmd import parse_policies
    from leaseproto.sim import compare, preset
    from leaseproto.sim.report import figure

    comp = compare(
        preset("both", duration=60.0),
        policies=parse_policies("fixed:480,fixed:30,lease,cap:300,cap:600", LeaseConfig()),
    )
    fig = figure(comp)
    try:
        ax = fig.axes[0]
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        policies = [f.policy for f in comp.figures]

        def dashes(line: object) -> str:  # the dash pattern drawn ("--" names several)
            return str(getattr(line, "_unscaled_dash_pattern", line.get_linestyle()))  # type: ignore[attr-defined]

        looks = [
            (to_hex(lines[p].get_color()), dashes(lines[p]), lines[p].get_marker())
            for p in policies
        ]
        for i in range(3):  # colour, line style and marker each tell the policies apart
            assert len({look[i] for look in looks}) == len(policies), looks
        crash = lines["D crash"]
        marker_look = (to_hex(crash.get_color()), dashes(crash))
        assert all(look[:2] != marker_look and look[0] != marker_look[0] for look in looks)
        # the lease line is not hidden under lease+cap: it is drawn wider, beneath
        lease, capped = lines["lease"], lines["lease+cap 300s"]
        assert lease.get_linewidth() > capped.get_linewidth()
        assert lease.get_zorder() < capped.get_zorder()
    finally:
        plt.close(fig)


def test_the_report_table_fits_80_columns_and_spreads_out_when_there_is_room() -> None:
    """One table, drawn without rich: a policy's name wraps at its spaces only
    when the columns would not fit otherwise."""
    import io

    from leaseproto.sim import compare, preset
    from leaseproto.sim.report import print_report, table

    comp = compare(preset("surge", duration=60.0), seed=0, keep_runs=False)
    wide = table(comp, 200).splitlines()
    assert wide[0].split() == ["fixed", "480s", "fixed", "30s", "lease", "lease+cap", "300s"]
    assert set(wide[1]) == {"-", " "}  # the names took one line
    narrow = table(comp, 70).splitlines()
    assert all(len(ln) <= 70 for ln in narrow), narrow
    # the widest names wrapped, the others kept whole, each ending on the line above the rule
    assert narrow[0].split() == ["fixed", "lease+cap"]
    assert narrow[1].split() == ["480s", "fixed", "30s", "lease", "300s"]
    assert set(narrow[2]) == {"-", " "}
    # the same rows, whatever the width
    assert [ln.split() for ln in narrow[3:]] == [ln.split() for ln in wide[2:]]
    out = io.StringIO()  # not a terminal: 80 columns
    print_report(comp, out)
    lines = out.getvalue().splitlines()
    assert all(len(ln) <= 80 for ln in lines) and lines[-1].startswith("released: expired"), lines
