"""``leaseproto demo`` as a user runs it: Ctrl-C stops every worker process
and prints a line, not a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_for

pytestmark = pytest.mark.e2e


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited, not yet reaped by whoever adopted it


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "leaseproto", "demo", "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a job
    )
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
