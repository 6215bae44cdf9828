"""The runtime's hot loops equal the rules (lemma L14 of ``leaseproto prove``).

The renewal loops (``core/renewal.py``), the reaper's ``expire_end``
(``core/table.py``) and the deadline the deadline queue takes its list of grants at
(``core/deadlines.py``) are ordinary code beside the rules; ``proofs/loops.py`` runs
that code on z3 terms, path by path, and proves it does what the rules do. Here:
those obligations hold; a bug seeded into a temporary copy of a loop's source fails
them, naming the loop (the seeded bug that once passed ``prove`` and every checker
scope, a loop that revives a lapsed lease, first of all, through the CLI); a rule the
loop no longer follows fails them too; and random concrete inputs agree with calling
the rules per id.
"""

from __future__ import annotations

import importlib.util
import io
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leaseproto.core import renewal, table
from leaseproto.core import rules as R
from leaseproto.core.lease import Lease

z3 = pytest.importorskip("z3")
from leaseproto.proofs import loops, solver  # noqa: E402
from leaseproto.proofs.code_runs import loop_obligations  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "leaseproto" / "core"


def _run_loops(only: str = "") -> tuple[int, str]:
    """Discharge the L14 obligations whose label contains ``only``: (how many failed,
    what ``prove`` prints for them)."""
    buf = io.StringIO()
    solver.configure()
    failed = solver.discharge(loop_obligations(only), buf)
    return failed, buf.getvalue()


def test_every_loop_obligation_holds_and_each_covers_many_paths() -> None:
    status, out = _run_loops()
    assert status == 0, out
    labels = [ln for ln in out.splitlines() if ln.startswith("ok   [loops] L14")]
    # renew uncapped/capped, expire and the grants' deadlines, over reals and doubles
    assert len(labels) == 8, out
    for label, chk in loops.checks():
        assert not chk.error, (label, chk.error)
        # every heartbeat of up to two ids (live, ended, unknown, a duplicate), with and
        # without ``lost``: a disjunct per path of each; expire_end has three paths
        least = 1 if "grants" in label else 3 if "expire" in label else 100
        assert len(chk.bad) >= least, (label, len(chk.bad))


def _mutant(tmp_path: Path, name: str, old: str, new: str) -> ModuleType:
    """``leaseproto/core/<name>.py`` with ``old`` replaced by ``new`` once, written to a
    temporary file and loaded from it as a module of the core package (its relative
    imports find the real core); the real module is left as it is."""
    src = (CORE / f"{name}.py").read_text()
    assert src.count(old) == 1, f"{old!r} is not in core/{name}.py exactly once"
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"leaseproto.core.{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_LAPSED_RENEWS = (
    "            deadline = held.deadline\n"
    "            if now < deadline:\n"
    "                held.deadline = deadline if deadline >= target else target  # vmax (I1)",
    "            deadline = held.deadline\n"
    "            if True:\n"
    "                held.deadline = deadline if deadline >= target else target  # vmax (I1)",
)

#: name -> (core module, old, new, a label that must FAIL)
SEEDED: dict[str, tuple[str, str, str, str]] = {
    "the common loop revives a lapsed lease": ("renewal", *_LAPSED_RENEWS, "(uncapped, real)"),
    "the common loop renews at the deadline": (
        "renewal",
        "deadline = held.deadline\n            if now < deadline:",
        "deadline = held.deadline\n            if now <= deadline:",
        "(uncapped, real)",
    ),
    "the common loop assigns instead of max": (
        "renewal",
        "held.deadline = deadline if deadline >= target else target  # vmax (I1)",
        "held.deadline = target",
        "(uncapped, ieee)",
    ),
    "the capped loop ignores the cap": (
        "renewal",
        "new = target if target <= cap_at else cap_at  # vmin: never past the cap (I7)",
        "new = target",
        "(capped, real)",
    ),
    "a lost report for a transferred lease": (
        "renewal",
        "if lost is not None and tomb[0] != R.TRANSFERRED:",
        "if lost is not None:",
        "(uncapped, real)",
    ),
    "the id loop stops at the first renewal": (
        "renewal",
        "            renewed += 1\n            continue",
        "            renewed += 1\n            break",
        "(uncapped, real)",
    ),
    "a lapsed lease not counted": (
        "renewal",
        '    c["renew_lapsed"] += 1\n',
        "    pass\n",
        "(uncapped, real)",
    ),
    "the common loop does not subtract a lapsed lease": (
        "renewal",
        "            lapsed += 1\n            _lapsed(held.req_id",
        "            _lapsed(held.req_id",
        "(uncapped, ieee)",
    ),
    "the capped loop keeps the old last renewal": (
        "renewal",
        "            lease.deadline = deadline if deadline >= new else new  # vmax (I1)\n"
        "            lease.last_renewal = now\n            continue\n        lapsed",
        "            lease.deadline = deadline if deadline >= new else new  # vmax (I1)\n"
        "            continue\n        lapsed",
        "(capped, real)",
    ),
    "the grants are taken a second late": (
        "deadlines",
        "return R.grant_deadline(lease.granted_at, self._ttl)",
        "return R.grant_deadline(lease.granted_at, self._ttl) + 1",
        "the grants' deadlines = grant_deadline (real)",
    ),
    "the reaper expires at the deadline's float below": (
        "table",
        "if state == R.GRANTED and deadline <= now:",
        "if state == R.GRANTED and deadline < now:",
        "expire_end = expire_due, expire_state (real)",
    ),
    "the reaper ends a lease ABORTED": (
        "table",
        "        return R.EXPIRED\n    return None",
        "        return R.ABORTED\n    return None",
        "expire_end = expire_due, expire_state (ieee)",
    ),
}


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_a_bug_seeded_into_a_loop_fails_an_obligation(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, old, new, label = SEEDED[name]
    monkeypatch.setattr(loops, module, _mutant(tmp_path, module, old, new))
    status, out = _run_loops(label)
    assert status == 1, out
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL [loops] L14")]
    assert any(label in ln for ln in fails), out
    assert "a path through the loop does what the rules do not" in out
    # the counterexample
    assert "       on ids " in out or "       on expire_end" in out or "       on grant_" in out


def test_the_revived_lapsed_lease_fails_leaseproto_prove(tmp_path: Path) -> None:
    """The seeded bug of issue 19, end to end: a copy of the package whose common renew
    loop revives a lapsed lease, and ``leaseproto prove`` run on it exits 1 naming L14."""
    copy = tmp_path / "leaseproto"
    shutil.copytree(ROOT / "leaseproto", copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "proofs", copy / "proofs", ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "core" / "renewal.py"
    src = loop.read_text()
    assert src.count(_LAPSED_RENEWS[0]) == 1
    loop.write_text(src.replace(*_LAPSED_RENEWS))
    argv = [sys.executable, "-m", "leaseproto", "prove", "--system", "loops"]
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    probe = [sys.executable, "-c", "import leaseproto.core.renewal as m; print(m.__file__)"]
    where = subprocess.run(probe, capture_output=True, text=True, env=env, check=True, cwd=tmp_path)
    assert where.stdout.strip() == str(loop)  # the copy is what runs
    bad = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL [loops] L14 renew loops = renew_rule, renew_lost (uncapped, real)" in bad.stdout
    good = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT)
    assert good.returncode == 0, good.stdout + good.stderr


def _assigning_renewal(
    state: Any, deadline: Any, cap_at: Any, now: Any, extension: Any
) -> tuple[Any, Any]:
    applies = R.conj(state == R.GRANTED, now < deadline)
    target = now + extension if cap_at is None else R.vmin(now + extension, cap_at)
    return applies, R.ite(applies, target, deadline)


def test_a_rule_the_loops_no_longer_follow_fails_the_obligations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loops are not generated from the rules: change a rule and the loop keeps
    doing what it did, so ``prove`` says they differ (each side must change)."""
    monkeypatch.setattr(R, "renew_rule", _assigning_renewal)
    monkeypatch.setattr(
        R, "expire_due", lambda state, deadline, now: R.conj(state == 1, deadline < now)
    )
    status, out = _run_loops()
    assert status == 6, out  # every loop obligation fails


def test_a_loop_that_raises_on_symbolic_values_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mutant = _mutant(
        tmp_path,
        "table",
        "    if state == R.GRANTED and",
        "    if math.isnan(now) or state == R.GRANTED and",
    )
    monkeypatch.setattr(loops, "table", mutant)
    status, out = _run_loops("expire_end")
    assert status == 2 and "expire_end raised TypeError" in out, out


# -- the loops on concrete values -----------------------------------------------------------
_floats = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 5.0, 20.0, 30.0, 1e-300, 1e300, math.inf, -math.inf]),
    st.floats(allow_nan=False, min_value=-1e6, max_value=1e6),
)


def _same(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return x is y
    return (x == y and math.copysign(1, x) == math.copysign(1, y)) or (
        math.isnan(x) and math.isnan(y)
    )


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from("abcxyu"), _floats, _floats), min_size=1, max_size=8),
    _floats,
    _floats,
    st.one_of(st.none(), _floats),
    st.sampled_from([R.TRANSFERRED, R.EXPIRED, R.ABORTED]),
)
def test_the_renew_loops_match_the_rules_per_id(
    items: list[tuple[str, float, float]],
    now: float,
    ext: float,
    cap: float | None,
    tomb: int,
) -> None:
    """Leases ``a``-``c`` are live, ``x``, ``y`` ended (``y`` by a transfer), ``u``
    unknown: the loop against :func:`R.renew_rule` and :func:`R.renew_lost` applied to
    each id in turn, bit for bit (NaN where ``now + extension`` is one); a lease's cap
    is ``granted_at + cap``, as the table computes it."""
    first = {rid: (d, g) for rid, d, g in reversed(items)}
    held = {k: first.get(k, (1.0, 2.0)) for k in "abc"}  # (deadline, granted_at)
    live = {k: Lease(k, g, d, seq=0) for k, (d, g) in held.items()}
    ref = {k: (v.deadline, None) for k, v in live.items()}
    ended = {"x": (tomb, 0.0), "y": (R.TRANSFERRED, 0.0)}
    ids = [rid for rid, _, _ in items]
    found = [live.get(i) for i in ids]
    lost: list[str] = []
    c = {"renew_unknown": 0, "renew_late": 0, "renew_lapsed": 0}
    renewed = renewal.renew_ids(ids, found, all(found), ended, now, ext, cap, lost, c)
    want_lost, want_c = [], {"renew_unknown": 0, "renew_late": 0, "renew_lapsed": 0}
    want_renewed = 0
    for rid in ids:
        lease = live.get(rid)
        state = R.GRANTED if lease else ended[rid][0] if rid in ended else R.ABSENT
        deadline = ref[rid][0] if lease else 0.0
        cap_at = None if lease is None or cap is None else lease.granted_at + cap
        applies, new = R.renew_rule(state, deadline, cap_at, now, ext)
        if lease is not None and applies:
            ref[rid] = (new, now)
        want_renewed += applies
        key = "renew_lapsed" if lease else "renew_late" if rid in ended else "renew_unknown"
        want_c[key] += not applies
        if R.renew_lost(state, applies):
            want_lost.append(rid)
    assert (renewed, c, lost) == (want_renewed, want_c, want_lost)
    for k in "abc":
        assert _same(live[k].deadline, ref[k][0]), k
        assert _same(live[k].last_renewal, ref[k][1]), k


@given(
    st.sampled_from([R.ABSENT, R.GRANTED, R.TRANSFERRED, R.EXPIRED, R.ABORTED]), _floats, _floats
)
def test_expire_end_matches_the_rules(state: int, deadline: float, now: float) -> None:
    due = R.expire_due(state, deadline, now)
    assert table.expire_end(state, deadline, now) == (
        R.expire_state(state, deadline, now) if due else None
    )


def test_expire_requeues_a_lease_the_reaper_s_rule_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    """``expire`` asks ``expire_end`` of what the queue hands it and puts back a lease it
    finds not due (never, while the queue hands only due leases: the table system's L11;
    here ``expire_end`` is replaced by one with 5 s of grace to reach that branch)."""
    from leaseproto import LeaseConfig, LeaseTable, ReleaseReason

    def with_grace(state: int, deadline: float, now: float) -> int | None:
        return R.EXPIRED if state == R.GRANTED and deadline + 5.0 <= now else None

    t = LeaseTable(LeaseConfig(tombstone_capacity=1))
    t.grant("a", now=0.0)
    t.grant("b", now=0.0, ttl=40.0)
    t.grant("c", now=0.0, ttl=36.0)
    monkeypatch.setattr(table, "expire_end", with_grace)
    got = [(r.req_id, r.reason) for r in t.expire(now=42.0)]
    assert got == [("a", ReleaseReason.EXPIRED), ("c", ReleaseReason.EXPIRED)]
    assert t.stats.released_expired == 2 and t.live() == ["b"] and t.next_deadline() == 40.0
    assert t.ended("c") is ReleaseReason.EXPIRED and t.ended("a") is None  # capacity 1
    assert t.expire(now=44.0) == []
    assert [r.req_id for r in t.expire(now=45.0)] == ["b"]
    assert t.stats.released_expired == 3
