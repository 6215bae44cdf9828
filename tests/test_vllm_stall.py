"""The watchdog of ``benchmarks/vllm_pd.py``'s real-engine runs (``benchmarks/_vllm_stall.py``):
a request past its limit gets every vLLM process of the pair to write its stacks to
its server's log (``faulthandler`` on SIGUSR1, registered by ``server_site``), and
only those processes are signalled; a request within the limit leaves no trace.
Stand-ins for a server's processes, no vLLM needed; they die with the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from _vllm_stall import (  # noqa: E402
    Watchdog,
    cpu_ticks,
    faulthandler_lines,
    innermost_frames,
    kernel_view,
    vllm_processes,
)

# a process that registers SIGUSR1 as server_site does and waits in a named function,
# with a child in its group that registers nothing (like multiprocessing's resource
# tracker), which SIGUSR1 would end; both die with their parent
SERVING = """
import ctypes, faulthandler, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
faulthandler.register(signal.SIGUSR1, all_threads=True)
BYSTANDER = "import ctypes, signal, time; ctypes.CDLL(None).prctl(1, 9); time.sleep(30)"
child = subprocess.Popen([sys.executable, "-c", BYSTANDER])
def stuck_in_a_step():  # vllm.entrypoints.openai.api_server stand-in
    time.sleep(30)
print(child.pid, flush=True)
stuck_in_a_step()
"""


class _Server:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVING],
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.bystander = int(self.proc.stdout.readline())

    def alive(self) -> bool:
        stat = Path(f"/proc/{self.bystander}/stat")
        return self.proc.poll() is None and stat.exists() and ") Z" not in stat.read_text()

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Any:
    s = _Server(tmp_path / "P.log")
    yield s
    s.stop()


def test_only_the_servers_processes_are_named(server: _Server) -> None:
    assert vllm_processes(server.proc.pid) == {server.proc.pid: "API server"}


def test_a_stalled_request_leaves_the_stacks(server: _Server, capsys: Any) -> None:
    dog = Watchdog({"P": server}, after=0.2)
    with dog.request("conversation 0 to port 1"):
        time.sleep(3.0)  # the dump waits 2 s for the log
    assert len(dog.stalls) == 1
    stall = dog.stalls[0]
    assert stall["request"] == "conversation 0 to port 1" and stall["after_s"] == 0.2
    assert list(stall["P"]) == [f"API server {server.proc.pid}"]
    assert any("stuck_in_a_step" in line for line in stall["P"][f"API server {server.proc.pid}"])
    assert server.alive()  # neither the server nor its bystander ended
    # what the kernel said of it, taken before the signal: its one thread, named, and
    # the CPU it got over a second (asleep: none)
    kernel = stall["kernel"]["P"][f"API server {server.proc.pid}"]
    assert kernel[0].startswith(f"{server.proc.pid} python"), kernel
    assert kernel[0].endswith(" cpu+0"), kernel
    assert "stall: conversation 0 to port 1 took over 0.2 s" in capsys.readouterr().out


def test_a_request_within_the_limit_leaves_nothing(server: _Server) -> None:
    dog = Watchdog({"P": server}, after=5.0)
    with dog.request("quick"):
        time.sleep(0.1)
    time.sleep(0.2)
    assert dog.stalls == []
    assert "stuck_in_a_step" not in server.log.read_text()


def test_kernel_view_names_each_thread_and_its_wait(server: _Server) -> None:
    deadline = time.monotonic() + 10.0
    while True:  # on a loaded machine the stand-in may not be asleep yet
        view = kernel_view(server.proc.pid)
        if " S " in view[0] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    heads = [line for line in view if not line.startswith(" ")]
    assert len(heads) == 1, view  # one thread, asleep
    tid, comm, state, _wchan, syscall, on = heads[0].split(" ")
    assert (tid, state) == (str(server.proc.pid), "S") and comm.startswith("python"), view
    assert syscall.startswith("syscall=") and on.startswith("on="), view
    assert int(on.removeprefix("on=")) in os.sched_getaffinity(server.proc.pid), view


def test_kernel_view_says_how_much_cpu_each_thread_got() -> None:
    """A thread asleep gets no CPU over a second; one that spins gets some (on a
    loaded machine not in every second: it is sampled until it has run, 20 s at most)."""
    # each dies with the test, also when the run is killed (parent-death signal)
    ready = "import ctypes, time; ctypes.CDLL(None).prctl(1, 9); print('ready', flush=True)\n"
    for code, busy in (
        (ready + "while True:\n    pass\n", True),
        (ready + "time.sleep(30)", False),
    ):
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"  # the start-up is not counted
            time.sleep(0.1)  # nor the print
            for _ in range(20 if busy else 1):
                before = cpu_ticks(proc.pid)
                assert list(before) == [str(proc.pid)], before
                time.sleep(1.0)
                line = kernel_view(proc.pid, before)[0]
                got = int(line.rsplit(" cpu+", 1)[1])
                if got:
                    break
            assert (got > 0) if busy else (got == 0), (busy, line)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert kernel_view(2**22 + 1) == []  # no such process: nothing, no error


def test_faulthandler_lines_keep_the_stacks_only() -> None:
    text = (
        "INFO: 127.0.0.1 - POST /v1/completions 200\n"
        "Current thread 0x00007f (most recent call first):\n"
        '  File "/x/notifications.py", line 332 in _on_hello\n'
        "(Worker pid=1) INFO something else\n"
    )
    assert faulthandler_lines(text) == [
        "Current thread 0x00007f (most recent call first):",
        '  File "/x/notifications.py", line 332 in _on_hello',
    ]


def test_innermost_frames_name_where_each_thread_was() -> None:
    lines = [
        "Thread 0x1 (most recent call first):",
        '  File "/x/shm_broadcast.py", line 208 in wait',
        '  File "/x/executor.py", line 1041 in worker_busy_loop',
        "Current thread 0x2 (most recent call first):",
        '  File "/x/_api.py", line 909 in add_remote_agent',
        '  File "/x/notifications.py", line 332 in _on_hello',
    ]
    assert innermost_frames(lines) == [
        '  File "/x/shm_broadcast.py", line 208 in wait',
        '  File "/x/_api.py", line 909 in add_remote_agent',
    ]


def test_a_dump_under_way_is_kept_when_the_request_returns(server: _Server) -> None:
    """The request ends while the stacks are being taken (a server that fails its
    request just past the limit): they are kept before the caller reads them."""
    dog = Watchdog({"P": server}, after=0.1)
    with dog.request("returns during the dump"):
        time.sleep(0.2)  # the dump waits at least 0.2 s for the log to stop growing
    assert len(dog.stalls) == 1 and dog.stalls[0]["P"], dog.stalls
