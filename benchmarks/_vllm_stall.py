"""Where a stalled vLLM server was, for ``benchmarks/vllm_pd.py``.

On two busy cores a real engine has stopped taking steps for minutes (its worker
inside a NIXL call, once in ``add_remote_agent``), and vLLM ends an engine whose step
takes longer than its execute-model timeout (300 s). :class:`Watchdog` times each
request; once one has taken ``after`` seconds it sends SIGUSR1 to every vLLM process
of the pair (``server_site/sitecustomize.py`` registered ``faulthandler`` for it, so
each writes every thread's Python stack to its server's log, also from inside C code)
and keeps those stacks, so a failed or slow conversation says where each engine was.

A process that is inside the kernel in an uninterruptible wait, or gets no CPU, services
no signal and writes no Python stack (a prefill worker did so in CI). So the watchdog
also keeps what Linux says of every thread of each process (:func:`kernel_view`): its
state, the kernel function it waits in, its system call, the CPU it last ran on, the
CPU time it got over one second, and its kernel stack.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from itertools import pairwise
from pathlib import Path
from typing import Any, Protocol

from _reaper import group_processes

__all__ = [
    "STALL_S",
    "Watchdog",
    "cpu_ticks",
    "faulthandler_lines",
    "innermost_frames",
    "kernel_view",
    "vllm_processes",
]

#: A request this long (a tiny model's turn takes seconds) counts as a stall.
STALL_S = 120.0
#: At most this many lines of stacks are kept per server.
MAX_LINES = 120
#: At most this many frames of each thread's kernel stack are kept.
MAX_FRAMES = 8
#: The CPU each thread of a stalled pair gets is measured over this long.
KERNEL_SAMPLE_S = 1.0


class _Server(Protocol):
    @property
    def log(self) -> Path: ...

    @property
    def proc(self) -> Any: ...


def vllm_processes(group: int) -> dict[int, str]:
    """The live vLLM processes (API server, engine core, workers) of process group
    ``group``, each with its title: those whose start-up imported ``server_site``.
    Others in the group (multiprocessing's resource tracker) are left alone: SIGUSR1
    would end them."""
    out = {}
    for pid in group_processes(group):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:  # it ended meanwhile
            continue
        if cmd.startswith("VLLM::"):  # vLLM's title for its engine core and workers
            out[pid] = cmd.split("\0", 1)[0].strip()
        elif "vllm.entrypoints" in cmd:
            out[pid] = "API server"
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # it ended meanwhile, or the kernel keeps it to itself
        return "?"


def _stat(task: Path) -> tuple[str, list[str]]:
    """A thread's name and the fields of its ``stat`` after the name (state first)."""
    name, _, rest = _read(task / "stat").rpartition(")")
    return name.partition("(")[2], rest.split()


def _ticks(fields: list[str]) -> int | None:
    """User + system CPU time (clock ticks) from :func:`_stat`'s fields, if there."""
    return int(fields[11]) + int(fields[12]) if len(fields) > 12 else None


def _tasks(pid: int) -> list[Path]:
    try:
        return sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name))
    except OSError:  # it ended meanwhile
        return []


def cpu_ticks(pid: int) -> dict[str, int]:
    """Each thread's CPU time so far (user + system, in clock ticks), by thread id."""
    ticks = {}
    for task in _tasks(pid):
        n = _ticks(_stat(task)[1])
        if n is not None:
            ticks[task.name] = n
    return ticks


def kernel_view(pid: int, since: Mapping[str, int] | None = None) -> list[str]:
    """One line per thread of ``pid`` (``tid name state wchan syscall on=CPU``, and
    with ``since``, a :func:`cpu_ticks` taken earlier, ``cpu+N``: the ticks it ran
    since), then that thread's kernel stack, indented: where a thread that writes no
    Python stack is, and whether it runs at all."""
    out = []
    for task in _tasks(pid):
        comm, fields = _stat(task)
        state = fields[0] if fields else "?"
        line = f"{task.name} {comm} {state} {_read(task / 'wchan')}"
        line += f" syscall={_read(task / 'syscall').split(' ', 1)[0]}"
        line += f" on={fields[36]}" if len(fields) > 36 else ""
        n = _ticks(fields)
        if since is not None and task.name in since and n is not None:
            line += f" cpu+{n - since[task.name]}"
        out.append(line)
        out += [f"    {frame}" for frame in _read(task / "stack").splitlines()[:MAX_FRAMES]]
    return out


def faulthandler_lines(text: str) -> list[str]:
    """The lines of ``faulthandler`` stacks in ``text`` (a server log's tail)."""
    heads = ("Thread 0x", "Current thread 0x", '  File "')
    return [line for line in text.splitlines() if line.startswith(heads)][:MAX_LINES]


def innermost_frames(lines: list[str]) -> list[str]:
    """Where each thread of a dump was: the frame after each thread's header."""
    return [
        frame
        for head, frame in pairwise(lines)
        if not head.startswith("  ") and frame.startswith("  ")
    ]


class Watchdog:
    """Dumps the stacks of ``servers`` (name -> server) once per request that has
    taken ``after`` seconds; :attr:`stalls` keeps what each dump found."""

    def __init__(self, servers: Mapping[str, _Server], *, after: float = STALL_S) -> None:
        self.servers = dict(servers)
        self.after = after
        self.stalls: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @contextmanager
    def request(self, label: str) -> Iterator[None]:
        """Times the request made inside the block."""
        timer = threading.Timer(self.after, self.dump, args=(label,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # a dump under way is finished and kept before the caller goes on

    def dump(self, label: str) -> None:
        """Every server's stacks now, process by process (so that their writes to the
        one log do not interleave), kept in :attr:`stalls` and printed."""
        stall: dict[str, Any] = {"request": label, "after_s": self.after, "kernel": {}}
        procs = {name: vllm_processes(s.proc.pid) for name, s in self.servers.items()}
        # before the signals: what each was doing, not what the handler does, and how
        # much CPU each thread got over one second (a runnable thread that gets none
        # waits for a CPU, one that spins gets a whole one)
        ticks = {pid: cpu_ticks(pid) for per in procs.values() for pid in per}
        time.sleep(KERNEL_SAMPLE_S)
        for name, s in self.servers.items():
            stall["kernel"][name] = {
                f"{t} {pid}": kernel_view(pid, ticks[pid]) for pid, t in procs[name].items()
            }
            stall[name] = {
                f"{title} {pid}": self._stacks(s.log, pid) for pid, title in procs[name].items()
            }
        with self._lock:
            self.stalls.append(stall)
        print(f"stall: {label} took over {self.after:g} s; stacks:", flush=True)
        for name in self.servers:
            for proc, lines in stall[name].items():
                for line in innermost_frames(lines):
                    print(f"  {name} {proc}:{line}", flush=True)
                if not lines:  # it serviced no signal: where the kernel holds it
                    for line in stall["kernel"][name][proc]:
                        print(f"  {name} {proc} kernel: {line}", flush=True)

    @staticmethod
    def _stacks(log: Path, pid: int) -> list[str]:
        """What ``pid`` wrote to ``log`` on SIGUSR1: faulthandler writes from the
        signal handler, so the log grows at once; read once it stops growing."""
        size = log.stat().st_size if log.exists() else 0
        with suppress(OSError):  # it ended meanwhile
            os.kill(pid, signal.SIGUSR1)
        end, last = time.monotonic() + 2.0, -1
        while time.monotonic() < end:
            time.sleep(0.1)
            now = log.stat().st_size
            if now == last and now > size:
                break
            last = now
        with log.open("rb") as f:
            f.seek(size)
            return faulthandler_lines(f.read().decode("utf-8", "replace"))
