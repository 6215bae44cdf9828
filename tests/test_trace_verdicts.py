"""The verdict path measured from traces (``leaseproto.checker.trace_verdicts``,
issue 19): for each READ, how long until P polled its transfer-done, how long P took
to answer, how long until D polled the verdict, and until the read's release. A
measurement, never a violation: a late or missing verdict is listed, not failed."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_check_trace import P, _find, _write, legal

from leaseproto.checker.trace import check_files


def test_the_segments_of_a_verified_read(tmp_path: Path) -> None:
    """``legal()``: D reads at 101.9, P polls the transfer-done at 102.0 and answers
    OK at once, D polls the OK at 102.1 and uses the read at 102.2."""
    v = check_files(_write(tmp_path, *legal())).verdicts
    assert v.reads == 1 and v.unanswered == [] and v.late == []
    got = {s: v.delays[s] for s in v.delays}
    assert got["to_p_poll"] == [pytest.approx(0.1)]
    assert got["p_answer"] == [0.0]
    assert got["to_d_poll"] == [pytest.approx(0.1)]
    assert got["to_release"] == [pytest.approx(0.1)]
    assert got["read_to_use"] == [pytest.approx(0.3)]
    assert "verdicts: 1 reads" in check_files(_write(tmp_path, *legal())).summary()


def test_a_verdict_past_the_bound_is_late_and_one_never_heard_is_unanswered(
    tmp_path: Path,
) -> None:
    """The decode rank's own ``lease_extension`` (2 s for L 3) is the bound: an OK
    that D polls 2.5 s after P polled the transfer-done is late; with D's receipt
    removed, the read is unanswered and adds no delays."""
    p, d = legal()
    d[_find(d, ev="recv", data="OK:a")]["t"] = 104.5
    d[_find(d, ev="use")]["t"] = 104.6
    d.sort(key=lambda e: (e["ev"] != "header", e["ev"] == "end", e["t"]))
    report = check_files(_write(tmp_path, p, d))
    assert report.verdicts.late == ["a from " + P + ": 2.500 s"]
    assert report.verdicts.as_dict()["to_d_poll"]["max"] == pytest.approx(2.5)
    p, d = legal()
    del d[_find(d, ev="recv", data="OK:a")]
    v = check_files(_write(tmp_path, p, d)).verdicts
    assert (v.reads, v.unanswered, v.delays["to_p_poll"]) == (0, ["a from " + P], [])


def test_traces_of_another_boot_share_no_clock_so_nothing_is_measured(tmp_path: Path) -> None:
    p, d = legal()
    d[0]["boot"] = "boot-2"
    v = check_files(_write(tmp_path, p, d)).verdicts
    assert v.reads == 0 and v.summary() == "verdicts: no verified read"


def test_a_boot_id_of_any_json_type_is_compared_not_hashed(tmp_path: Path) -> None:
    """A header's ``boot`` is whatever JSON the file holds: a list (unhashable) is one
    more value that is not the other file's, never a traceback."""
    p, d = legal()
    p[0]["boot"] = ["boot-1"]
    report = check_files(_write(tmp_path, p, d))
    assert report.verdicts.reads == 0
    p, d = legal()
    p[0]["boot"] = d[0]["boot"] = ["boot-1"]
    assert check_files(_write(tmp_path, p, d)).verdicts.reads == 1
