"""``leaseproto demo`` as a user runs it: Ctrl-C stops every worker process
and prints a line, not a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_for
from pty_screen import run_in_pty

pytestmark = pytest.mark.e2e


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited, not yet reaped by whoever adopted it


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    # As from a terminal, the demo must not start with SIGINT ignored: a suite started in
    # the background by a shell without job control has it ignored, and children inherit
    # that (a handled signal, unlike an ignored one, is reset to the default at exec).
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseproto", "demo", "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
    )
    if ignored:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert proc.stdout is not None
        seen = ""
        while "phase 1" not in seen:  # the workers are up and serving
            line = proc.stdout.readline()
            assert line, "the demo exited early: " + (proc.stderr.read() if proc.stderr else "")
            seen += line
        time.sleep(1.0)
        ready = sorted((log_dir / "lease").glob("*.ready.json"))
        pids = [json.loads(p.read_text())["pid"] for p in ready]
        assert len(pids) == 3  # router, prefill, decode
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "interrupted" in err
    wait_for(lambda: all(_gone(p) for p in pids), "every worker process to exit", 15.0)


# -- the terminal --------------------------------------------------------------------------
SMALL = ["--first-wave", "6", "--waves", "2", "--wave", "2"]


def _is_status(line: str) -> bool:
    """A line of the live status: the phase, a bar, the figures."""
    return "━" in line or "answered |" in line or "done |" in line or "blocks freed;" in line


def test_demo_reads_well_in_80_columns() -> None:
    code, shown, most_status, seen = run_in_pty(["demo", *SMALL], _is_status, columns=80)
    text = "\n".join(shown)
    assert code == 0, text
    # the surge's live status shows what phase 3 is about, within the 80 columns
    surges = [ln for ln in seen if "answered |" in ln]
    assert surges and all(re.search(r"expired \d+ late \d+", ln) for ln in surges), surges
    # the live status is one line, redrawn in place: never two copies, none left over
    assert most_status == 1, text
    assert not any(_is_status(ln) for ln in shown), text
    # phase 2's moment of the kill stays readable
    kill = [ln for ln in shown if "SIGKILL D" in ln]
    assert len(kill) == 1 and "P holds" in kill[0], text
    # the verdicts and the tables are there, fitted to the width
    assert sum("->" in ln for ln in shown) == 5, text
    assert any(ln.lstrip().startswith("1 surge") for ln in shown), text
    assert any(ln.startswith("4 turns") for ln in shown), text
    assert any(ln.startswith("5 turns") and "gate-only" in ln for ln in shown), text
    assert not any("\u2026" in ln for ln in shown), text  # no table cell cut to fit
    assert "total " in text
    assert all(len(ln) <= 80 for ln in shown)


def test_demo_piped_is_plain_text_and_its_turns_phases_show_what_they_claim(
    tmp_path: Path,
) -> None:
    figures = tmp_path / "demo.json"
    out = subprocess.run(
        [sys.executable, "-m", "leaseproto", "demo", *SMALL, "--json", str(figures)],
        capture_output=True,
        timeout=420,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert b"\x1b" not in out.stdout and b"\r" not in out.stdout
    text = out.stdout.decode()
    assert "SIGKILL D" in text and text.count("->") == 5 and "total " in text
    run = json.loads(figures.read_text())
    ours, vllm = run["turns"]
    ttl = run["settings"]["turn_ttl"]
    for t in (ours, vllm):  # the same schedule: every turn 2 reached P's READ after D's lease
        assert t["conversations"] == 3 and len(t["reached_s"]) == 3, t
        assert min(t["reached_s"]) > ttl, t
    # ours: every answer right; P's heartbeats kept every queued turn's blocks (I16); the
    # stalled read's lease ran out, D said NK and P recomputed (I14); the traces are clean
    assert ours["reads"] == "verified"
    assert ours["identical"] == 3 and ours["differing"] == ours["failed"] == 0, ours
    assert ours["kept"] == 2 and ours["expired_waiting"] == 0 and ours["heartbeats"] > 0, ours
    assert ours["verified"] == 2 and ours["recomputed"] == {"nack": 1} and ours["nk"] == 1, ours
    assert ours["expired_stalled"] == 1 and ours["violations_i14"] == 0, ours
    assert run["trace_check"]["turns-verified"]["ok"]
    # gate-only: nothing kept D's blocks; the queued reads were refused by the gate and
    # the stalled one used as read from reused blocks: a wrong answer, and check-trace
    # names it (I14)
    assert vllm["reads"] == "gate-only" and vllm["heartbeats"] == 0 and vllm["nk"] == 0
    assert vllm["kept"] == 0 and vllm["expired_waiting"] == 2, vllm
    assert vllm["recomputed"] == {"gate": 2} and vllm["unverified"] == 1, vllm
    assert vllm["differing"] == 1 and vllm["identical"] == 2, vllm
    assert "DIFFERENT" in vllm["stalled"], vllm
    assert vllm["violations_i14"] == 1
    assert run["trace_check"]["turns-gate-only"]["by_invariant"] == {"I14": 1}


def test_demo_into_head_exits_quietly(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    cmd = f"{sys.executable} -m leaseproto demo --log-dir {log_dir} 2>{tmp_path / 'err'} | head -2"
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=300, check=False)
    assert len(r.stdout.splitlines()) == 2
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    pids = [json.loads(p.read_text())["pid"] for p in log_dir.glob("*/*.ready.json")]
    wait_for(lambda: all(_gone(p) for p in pids), "every worker process to exit", 15.0)
