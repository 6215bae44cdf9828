"""Run a command on a pseudo-terminal of a given size and read its screen back
through a terminal emulator (``pyte``), for tests of what a user sees."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
from collections.abc import Callable

import pytest

__all__ = ["run_in_pty"]


def run_in_pty(
    args: list[str], is_status: Callable[[str], bool], *, columns: int, rows: int = 24
) -> tuple[int, list[str], int, set[str]]:
    """Run ``leaseproto ARGS`` on a pseudo-terminal of ``columns`` x ``rows``, fed
    to a terminal emulator. Returns the exit status, every line the screen shows
    or scrolled off, the most lines ``is_status`` ever saw on it at once, and every
    such line it saw."""

    pyte = pytest.importorskip("pyte")
    screen = pyte.HistoryScreen(columns, rows, history=10_000)
    stream = pyte.ByteStream(screen)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the demo on the pty
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
        os.environ["TERM"] = "xterm-256color"
        os.execv(sys.executable, [sys.executable, "-m", "leaseproto", *args])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    most_status = 0
    seen: set[str] = set()

    def lines() -> list[str]:
        older = ["".join(c.data for c in row.values()) for row in screen.history.top]
        return [ln.rstrip() for ln in older + screen.display]

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        stream.feed(data)
        status = [ln for ln in lines() if is_status(ln)]
        most_status = max(most_status, len(status))
        seen.update(status)
    _, code = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(code), lines(), most_status, seen
