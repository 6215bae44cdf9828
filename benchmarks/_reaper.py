"""Processes a benchmark starts die with it, also when it is killed (SIGKILL included).

vLLM's API server runs its engine core and workers as child processes and has no
parent-death handling of its own, so killing the server's parent leaves them all
running. Each server runs in its own process group (so one ``killpg`` ends it and
its children), watched by a small reaper process: the reaper asks Linux for a
signal when its parent, the benchmark, dies (``PR_SET_PDEATHSIG``) and then kills
the whole group. :func:`die_with_parent` does the same for the benchmark itself, so
a test process killed at its time limit takes the benchmark, and through the
reapers every server, with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["die_with_parent", "group_processes", "reap_group_on_exit"]

PR_SET_PDEATHSIG = 1

_REAPER = r"""
import ctypes, os, signal, sys
group, parent = int(sys.argv[1]), int(sys.argv[2])
def reap(*_):
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
    os._exit(0)
signal.signal(signal.SIGTERM, reap)
ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # it died before the prctl
    reap()
while True:
    signal.pause()
"""


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies."""
    parent = os.getppid()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGKILL)


def reap_group_on_exit(group: int) -> subprocess.Popen[bytes]:
    """A reaper that SIGKILLs process group ``group`` when this process dies.
    Stop it (``terminate()``: it then kills the group too) once the group is gone."""
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(group), str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def group_processes(group: int) -> list[int]:
    """The live processes of process group ``group`` (zombies excluded), by pid."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # it ended meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return sorted(out)
