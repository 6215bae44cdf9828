"""The obligations that run the core's own code (proofs/: L15 the table, L16 the
tracker, L17 the codec, L18 the settings): each holds on today's code and fails,
naming its scenario, on a seeded bug of the code it runs (behaviour, not a crash)."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("z3")

from leaseproto.core import checks as checks_mod
from leaseproto.core import config as config_mod
from leaseproto.core import deadlines as deadlines_mod
from leaseproto.core import peer as peer_mod
from leaseproto.core import rules as R
from leaseproto.core import tracker as tracker_mod
from leaseproto.core import wire as wire_mod
from leaseproto.core import wire_ids as wire_ids_mod
from proofs import codec, settings, structures, tracking, units


def _failing(module: Any, only: str = "") -> list[str]:
    """The labels of ``module``'s checks that fail (a refuted one or one that raised)."""
    import z3

    out = []
    for label, chk in module.checks(only):
        s = z3.Solver()
        s.add(*chk.hyps, z3.Or(False, *(f for _, f in chk.bad)))
        if chk.error or s.check() != z3.unsat:
            out.append(label + (f" [raised] {chk.error}" if chk.error else ""))
    return out


def test_the_units_partition_every_obligation_in_order(every_obligation: list[Any]) -> None:
    from leaseproto.proofs import units as installed

    every = [(o.system, o.label) for o in every_obligation]
    parts = [(o.system, o.label) for build in installed.UNITS.values() for o in build()]
    assert parts == every
    assert list(units.UNITS) == list(installed.UNITS)


# -- L16: the tracker ---------------------------------------------------------------------
def test_the_tracker_agrees_with_the_naive_model() -> None:
    assert _failing(tracking) == []


def test_a_heartbeat_rule_strict_at_the_interval_fails_L16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "heartbeat_due", lambda last, now, interval: now - last > interval)
    failed = _failing(tracking, "one engine")
    assert failed and "raised" not in failed[0]


def test_a_threshold_past_the_rule_fails_L16(monkeypatch: pytest.MonkeyPatch) -> None:
    """The idle shortcut waits half a second too long (a threshold above the exact one)."""
    real = tracker_mod.HeartbeatTracker._threshold

    def late(self: tracker_mod.HeartbeatTracker) -> Any:
        t = real(self)
        return t if isinstance(t, float) else t + 0.5

    monkeypatch.setattr(tracker_mod.HeartbeatTracker, "_threshold", late)
    failed = _failing(tracking, "one engine")
    assert failed and "raised" not in failed[0]


def test_a_pending_engine_that_loses_its_turn_fails_L16(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tracker_mod.HeartbeatTracker.due

    def due(self: tracker_mod.HeartbeatTracker, *, now: float, pending: Any = ()) -> Any:
        out = real(self, now=now, pending=pending)
        for engine in pending:  # marked sent although nothing went out
            if engine in self._unsent:
                del self._unsent[engine]
                self._last_sent[engine] = now
        return out

    monkeypatch.setattr(tracker_mod.HeartbeatTracker, "due", due)
    assert _failing(tracking, "one pending")


def test_a_cut_one_byte_too_long_fails_L16(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tracker_mod.HeartbeatTracker.payloads

    def payloads(self: Any, ids: list[str], *, max_bytes: int | None = None) -> list[bytes]:
        return real(self, ids, max_bytes=(max_bytes or 64) + 1)

    monkeypatch.setattr(tracker_mod.HeartbeatTracker, "payloads", payloads)
    assert _failing(tracking, "one engine")


def test_a_track_that_takes_a_bool_as_now_fails_L16(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tracker_mod.HeartbeatTracker.track

    def track(self: Any, req_id: str, **kw: Any) -> None:
        if kw.get("now") is True:
            kw["now"] = 1.0e300  # taken as a time instead of refused
        real(self, req_id, **kw)

    monkeypatch.setattr(tracker_mod.HeartbeatTracker, "track", track)
    assert _failing(tracking, "misuse")


# -- L15: the table, the calendar, the renewals -------------------------------------------
def test_a_refused_count_taken_fails_L15(monkeypatch: pytest.MonkeyPatch) -> None:
    import leaseproto.core.table as table_mod

    real = checks_mod.check_count
    monkeypatch.setattr(
        table_mod, "check_count", lambda n, v, top: v if v == 0 else real(n, v, top)
    )
    failed = _failing(structures, "misuse")
    assert failed and "raised" not in failed[0]


def test_a_heartbeat_payload_that_renews_a_malformed_id_fails_L15(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import leaseproto.core.renewal as renewal_mod

    monkeypatch.setattr(renewal_mod, "id_problem", lambda rid: None)
    assert _failing(structures, "heartbeat payloads")


@pytest.mark.parametrize("part", ["calendar", "grants"])
def test_compaction_that_drops_live_leases_fails_L15(
    monkeypatch: pytest.MonkeyPatch, part: str
) -> None:
    """A compaction that forgets either part of the queue (the calendar's buckets, or
    the list of grants) with the live leases in it."""
    real = deadlines_mod.DeadlineQueue.compact

    def compact(self: deadlines_mod.DeadlineQueue, live: dict[str, Any]) -> None:
        real(self, live)
        if part == "calendar":
            self._buckets.clear()
            self._keys = []
        else:
            self._grants = []
            self._head = 0

    monkeypatch.setattr(deadlines_mod.DeadlineQueue, "compact", compact)
    assert _failing(structures, "compaction") == [
        "L15 LeaseTable = naive model: compaction keeps the live leases"
    ]


def test_a_whole_bucket_taken_without_its_check_fails_L15(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calendar's clean-bucket shortcut taken for a bucket with a renewed and an
    aborted entry: the table releases (or, for the aborted one, fails to delete) a lease
    the model does not (a KeyError out of ``expire`` counts: the real code crashed)."""
    monkeypatch.setattr(deadlines_mod, "_clean", lambda bucket, d: True)
    failed = _failing(structures, "bucket with a renewed")
    label = "L15 LeaseTable = naive model: a calendar bucket with a renewed and a stale entry"
    assert len(failed) == 1 and failed[0].startswith(label)
    assert "TypeError" not in failed[0]  # not the stand-in's own signature


# -- L17: the codec -------------------------------------------------------------------------
def test_the_codec_agrees_with_the_grammar() -> None:
    assert _failing(codec) == []


def test_a_count_of_zero_decoded_fails_L17(monkeypatch: pytest.MonkeyPatch) -> None:
    real = wire_mod.decode

    def decode(msg: bytes) -> Any:
        if isinstance(msg, bytes) and msg.endswith(b":0") and msg[:3] not in (b"NK:", b"LL:"):
            return wire_mod.TransferDone(msg[:-2].decode(), 1)
        return real(msg)

    monkeypatch.setattr(wire_mod, "decode", decode)
    assert _failing(codec, "decode") == ["L17 decode = the grammar of spec §3.6"]


def test_a_heartbeat_one_byte_over_fails_L17(monkeypatch: pytest.MonkeyPatch) -> None:
    real = wire_mod.encode_heartbeat
    monkeypatch.setattr(
        wire_mod,
        "encode_heartbeat",
        lambda ids, *, max_bytes=4096: real(ids, max_bytes=max_bytes + 1),
    )
    assert _failing(codec, "encode_heartbeat")


def test_an_id_equal_to_a_stem_accepted_fails_L17(monkeypatch: pytest.MonkeyPatch) -> None:
    real = wire_ids_mod.id_problem
    monkeypatch.setattr(wire_ids_mod, "id_problem", lambda rid: None if rid == "OK" else real(rid))
    assert _failing(codec, "request ids")


# -- L18: settings and argument checks ------------------------------------------------------
def test_the_settings_agree_with_the_rules() -> None:
    assert _failing(settings) == []


def test_an_extension_equal_to_the_interval_accepted_fails_L18(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = config_mod.LeaseConfig.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        if kw.get("lease_extension") is not None and kw.get("lease_extension") == kw.get(
            "heartbeat_interval"
        ):
            kw["lease_extension"] = math.nextafter(kw["lease_extension"], math.inf)
        real(self, *args, **kw)
        if kw.get("lease_extension") is not None:
            object.__setattr__(self, "lease_extension", float(kw["lease_extension"]))

    monkeypatch.setattr(config_mod.LeaseConfig, "__init__", init)
    assert _failing(settings, "LeaseConfig")


def test_a_bool_taken_as_a_count_fails_L18(monkeypatch: pytest.MonkeyPatch) -> None:
    real = checks_mod.check_count
    monkeypatch.setattr(
        checks_mod, "check_count", lambda n, v, top: v if v is True else real(n, v, top)
    )
    assert _failing(settings, "argument checks")


def test_a_first_contact_check_with_le_for_lt_fails_L18(monkeypatch: pytest.MonkeyPatch) -> None:
    def mismatch(peer: Any, own: Any, *, step_time: float = 0.0) -> str | None:
        h = own.heartbeat_interval
        return "T2: broken" if not h + step_time <= peer.lease_extension else None

    monkeypatch.setattr(peer_mod, "mismatch", mismatch)
    failed = _failing(settings, "first_contact")
    assert failed and "raised" not in failed[0]


# -- L19: the clock offset and the read gate -----------------------------------------------
def test_the_clock_agrees_with_the_spec() -> None:
    from proofs import clock_gate

    assert _failing(clock_gate) == []


def test_a_tie_that_replaces_the_kept_sample_fails_L19(monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseproto.core import clock as clock_mod
    from proofs import clock_gate

    real = clock_mod.R.aged_uncertainty
    # new < aged(kept) becomes new <= aged(kept): a tie now replaces the kept sample
    monkeypatch.setattr(
        clock_mod.R,
        "aged_uncertainty",
        lambda u, age, rho: math.nextafter(real(u, age, rho), math.inf),
    )
    failed = _failing(clock_gate)
    assert failed and "raised" not in failed[0]


def test_a_gate_that_ignores_the_uncertainty_fails_L19(monkeypatch: pytest.MonkeyPatch) -> None:
    from leaseproto.core import clock as clock_mod
    from proofs import clock_gate

    monkeypatch.setattr(clock_mod.ClockOffset, "uncertainty_at", lambda self, now: 0.0)
    assert _failing(clock_gate)


def test_fail_fast_stops_a_system_at_its_first_refuted_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mutation run's proofs layer builds a system's checks only up to the first one
    a path plainly refutes (one failed obligation decides a mutant); prove builds all."""
    from proofs import symexec

    monkeypatch.setattr(R, "heartbeat_due", lambda last, now, interval: now - last > interval)
    every = tracking.checks()
    monkeypatch.setattr(symexec, "FAIL_FAST", True)
    first = tracking.checks()
    assert len(every) == len(tracking.SCENARIOS) > len(first) >= 1
    assert first[-1][1].refuted and not any(c.refuted for _, c in first[:-1])


def test_a_path_that_raises_does_not_hide_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A path on which the code raises is a crash, but the scenario's other paths are
    still run, and a wrong answer on one of them (or before the raise) fails the
    obligation by behaviour (proofs/code_runs.py makes both obligations)."""
    from proofs import code_runs

    real = tracker_mod.HeartbeatTracker.due

    def due(self: tracker_mod.HeartbeatTracker, *, now: float, pending: Any = ()) -> Any:
        if self._c["heartbeats"] >= 2:  # raise once two heartbeats went out
            raise KeyError("f")
        out = real(self, now=now, pending=pending)
        return {e: ids[1:] for e, ids in out.items()}  # and drop an id before that

    monkeypatch.setattr(tracker_mod.HeartbeatTracker, "due", due)
    obs = code_runs.tracker_obligations("two engines")
    assert [o.crashed for o in obs] == [False, True]
    import io

    from leaseproto.proofs import solver

    assert solver.discharge(obs, io.StringIO()) == 2
    assert solver.LAST_RUN["crashed"] == 1  # one failed by behaviour, one by the raise


def test_a_queue_that_miscounts_its_stale_entries_fails_L15(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stale entry dropped without being counted off: no answer of the table shows it
    (the count only decides when to compact), so only the queue's representation
    invariant (each live lease one entry, ``stale`` the ended leases' entries) sees it."""
    monkeypatch.setattr(deadlines_mod.DeadlineQueue, "_dropped", lambda self: None)
    label = "L15 LeaseTable = naive model: a stale entry ahead of a live one in a calendar bucket"
    assert any(f.startswith(label) for f in _failing(structures, "stale entry ahead"))
    # without the invariant among the observations, the same bug passes every scenario
    monkeypatch.setattr(structures, "_queue_shape", lambda table: structures._QUEUE_OK)
    assert _failing(structures) == []
