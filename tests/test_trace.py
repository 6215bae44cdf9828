"""``leaseproto trace REQ_ID FILE...``: one request's lines from several workers'
logs (and JSON-lines event files), in time order, each with its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leaseproto.cli import main

DAY = "2026-12-01 17:53:"
P_LOG = "".join(
    f"{DAY}{t} leaseproto.prefill {level} {msg}\n"
    for t, level, msg in (
        ("26,100", "INFO", "granted req s3-1a2b3c4d a 3.0 s lease on 3 blocks (1 reader)"),
        ("26,150", "INFO", "granted req s30-99999999 a 3.0 s lease on 3 blocks (1 reader)"),
        ("27,100", "DEBUG", "renewed req s3-1a2b3c4d: lease ends in 2.00 s (heartbeat from d)"),
        ("29,900", "INFO", "released 3 blocks of req s3-1a2b3c4d: transferred 3.80 s after"),
    )
)
D_LOG = (
    f"{DAY}26,600 leaseproto.decode DEBUG heartbeat to P engine p (1 rank) naming 2 reqs: "
    "s30-99999999, s3-1a2b3c4d\n"
    "a line that is not a log line, naming s3-1a2b3c4d\n"
)


def test_trace_merges_one_request_in_time_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "prefill-0.log").write_text(P_LOG)
    (tmp_path / "decode-0.log").write_text(D_LOG)
    files = [str(tmp_path / "prefill-0.log"), str(tmp_path / "decode-0.log")]
    assert main(["trace", "s3-1a2b3c4d", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines] == [
        "prefill-0.log",
        "decode-0.log",
        "prefill-0.log",
        "prefill-0.log",
    ]
    assert "granted req" in lines[0] and lines[0].lstrip().startswith("0.000")
    assert "heartbeat to P engine" in lines[1] and "0.500" in lines[1]
    assert "renewed req" in lines[2] and "released 3 blocks" in lines[3]
    assert not any("s30-" in ln and "granted" in ln for ln in lines)
    # the client's id alone finds the router-named request, not s30's
    assert main(["trace", "s3", *files]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_trace_reads_json_event_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"t": 2.0, "kind": "release", "req_id": "r1", "reason": "expired"},
        {"t": 1.0, "kind": "grant", "req_id": "r1"},
        {"t": 1.5, "kind": "heartbeat", "ids": ["r0", "r1"]},
        {"t": 1.2, "kind": "grant", "req_id": "r2"},
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["trace", "r1", str(path)]) == 0
    kinds = [ln.split("kind=")[1].split()[0] for ln in capsys.readouterr().out.splitlines()]
    assert kinds == ["grant", "heartbeat", "release"]


def test_trace_nothing_found_and_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.log").write_text(P_LOG)
    assert main(["trace", "zz9", str(tmp_path / "p.log")]) == 1
    assert "no line" in capsys.readouterr().out
    assert main(["trace", "s3", str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_trace_reads_the_workers_event_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the format of `serve --trace` (leaseproto.workers.trace): ids in "req", in the
    # notification's wire text ("data") and in a renewal's "leases"
    rows = [
        {"ev": "header", "t": 0.5, "role": "prefill", "agent": "p"},
        {"ev": "grant", "t": 1.0, "now": 1.0, "req": "s3-1a2b3c4d", "lease": 3.0},
        {"ev": "recv", "t": 1.5, "src": "d", "data": "HB:s30-99999999,s3-1a2b3c4d"},
        {"ev": "renew", "t": 1.6, "now": 1.5, "leases": {"s3-1a2b3c4d": 2.0}},
        {"ev": "handle", "t": 2.0, "now": 2.0, "src": "d", "data": "s3-1a2b3c4d:1"},
        {"ev": "send", "t": 2.1, "to": "d", "data": "OK:s3-1a2b3c4d", "ok": True},
        {"ev": "send", "t": 2.2, "to": "d", "data": "NK:expired:s30-99999999", "ok": True},
        {"ev": "recv", "t": 2.3, "src": "d", "data": "HB:s30-99999999"},
    ]
    path = tmp_path / "prefill-0.trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["trace", "s3-1a2b3c4d", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[2] for ln in lines] == [
        "ev=grant",
        "ev=recv",
        "ev=renew",
        "ev=handle",
        "ev=send",
    ]
    assert "OK:s3-1a2b3c4d" in lines[-1]
