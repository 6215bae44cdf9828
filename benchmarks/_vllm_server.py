"""One real vLLM API server for the benchmarks, on loopback, started so that it comes up.

Ports. A port found free by binding to port 0 comes from the kernel's ephemeral range,
which is also where every outgoing connection and every other ``bind(0)`` (vLLM's own
``get_open_port``, ZeroMQ, UCX) takes its ports: between our pick and the engine's bind,
which comes only after the model has loaded, another process may take it. vLLM's NIXL
side channel is bound by a listener thread the engine waits on without a timeout
(``ready_event.wait()`` in 0.32's ``NixlConnectorScheduler``), so a taken side port
hangs the server, neither up nor exited (a CI run lost 600 s to it). Here ports come
from below the ephemeral range, where nothing picks ports on its own
(:func:`leaseproto.adapters.ports.free_port`), and a server whose log says a port was
taken is stopped and started again on fresh ports.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _reaper import reap_group_on_exit

from leaseproto.adapters.ports import free_port

__all__ = ["LEASE", "PORT_TAKEN", "LogWatch", "PortTaken", "Server", "unclaimed_port"]

SERVER_SITE = Path(__file__).resolve().parent / "server_site"
LEASE = 12  # kv_lease_duration: heartbeat every 2 s, extension 8 s (vLLM's derivation)
#: what a bind of a taken port leaves in the log (ZeroMQ's and the socket module's words)
PORT_TAKEN = "Address already in use"
#: how many times a server is started before a taken port is reported
STARTS = 3


def unclaimed_port(rng: random.Random | None = None) -> int:
    """A free TCP port on every address, from below the kernel's ephemeral range (so no
    ``bind(0)`` and no outgoing connection takes it meanwhile), not handed out before by
    this process (:func:`leaseproto.adapters.ports.free_port`)."""
    return free_port("", rng=rng)  # all addresses: the API server binds them all


class LogWatch:
    """Whether a growing log has said ``needle``, reading only what it gained since the
    last look (and the end of the last read, so a line cut there is still found)."""

    def __init__(self, path: Path, needle: str) -> None:
        self.path, self.needle = path, needle.encode()
        self._read, self._carry, self._seen = 0, b"", False

    def seen(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(self._read)
            new = f.read()
        self._read += len(new)
        text = self._carry + new
        self._carry = text[-len(self.needle) :]
        self._seen = self._seen or self.needle in text
        return self._seen


class PortTaken(RuntimeError):
    """The server's log says a port it binds was taken by another process."""


class Server:
    """A vLLM API server with a NIXL connector (``connector``), in its own process group,
    reaped when this process dies; :meth:`wait_up` until it serves."""

    def __init__(
        self,
        *,
        model: Path,
        role: str,
        connector: str,
        cpu: str,
        log: Path,
        max_num_seqs: int,
        blocks: int,
        traces: Path | None = None,
        bidirectional: bool = False,
        engine_id: str | None = None,
        more: dict[str, Any] | None = None,
    ) -> None:
        extra: dict[str, Any] = {"kv_lease_duration": LEASE, **(more or {})}
        if bidirectional:  # D keeps a finished turn's KV for P to read (vLLM's turn 2)
            extra["bidirectional_kv_xfer"] = True
        ours = connector.startswith("Leaseproto")
        if traces is not None and ours:
            extra["trace_dir"] = str(traces)  # check-trace validates the run
        cfg: dict[str, Any] = {
            "kv_connector": connector,
            "kv_role": role,
            "kv_buffer_device": "cpu",
            "kv_connector_extra_config": extra,
            # a failed load recomputes instead of failing the request (0.32's default is "fail")
            "kv_load_failure_policy": "recompute",
        }
        if ours:
            cfg["kv_connector_module_path"] = "leaseproto.integrations.vllm"
        if engine_id is not None:
            cfg["engine_id"] = engine_id
        self.role, self.cpu, self.log = role, cpu, log
        self.args = [
            "--served-model-name",
            "m",
            "--model",
            str(model),
            "--enforce-eager",
            "--max-model-len",
            "512",
            # float32: the runs compare each completion with the same prompt served alone, so
            # a request's tokens must not depend on what else is in the batch. In bfloat16 on a
            # CPU without native bf16 (Intel Xeon, AVX-512 without avx512_bf16), vLLM 0.32
            # served 2 of 6 prompts differently when two were decoded together (stock, one
            # engine, no P/D; 2026-12-07); in float32 6 of 6 were the same (docs/vllm.md).
            "--dtype",
            "float32",
            "--block-size",
            "32",
            "--max-num-seqs",
            str(max_num_seqs),
            "--num-gpu-blocks-override",
            str(blocks),
            "--no-enable-prefix-caching",
            "--kv-transfer-config",
            json.dumps(cfg),
        ]
        self.starts = 0
        self._spawn()

    def _spawn(self) -> None:
        self.port = unclaimed_port()
        self.side_port = unclaimed_port()  # NIXL's side channel (a push router names it to D)
        env = {
            **os.environ,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
            "VLLM_PORT": str(unclaimed_port()),
            "VLLM_CPU_OMP_THREADS_BIND": self.cpu,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "NIXL_LOG_LEVEL": "ERROR",
            # Prometheus counters follow the stats logger; its default 10 s would blur the timings
            "VLLM_LOG_STATS_INTERVAL": "0.5",
            # every server, stock included: AMX tiles, stacks on SIGUSR1 (server_site/)
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(SERVER_SITE), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", str(self.port)]
        self.starts += 1
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [*cmd, *self.args],
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.reaper = reap_group_on_exit(self.proc.pid)  # the group dies with this process
        self.taken = LogWatch(self.log, PORT_TAKEN)
        print(f"started {self.role} server pid {self.proc.pid}", flush=True)

    def _tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def wait_up(self, timeout: float = 600.0) -> None:
        """Until the server answers ``/health``. A server whose port was taken is started
        again on fresh ports (``STARTS`` in all, the failed start's log kept beside the
        log with its start number); one that exits, or is still not up after ``timeout``,
        raises with the end of its log."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.taken.seen():
                if self.starts >= STARTS:
                    raise PortTaken(f"a port was taken at each of {STARTS} starts: {self._tail()}")
                print(f"{self.role}: a port was taken; starting again", flush=True)
                self.stop()
                self.log.rename(self.log.with_name(f"{self.log.name}.{self.starts}"))
                self._spawn()
                continue
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited; see {self.log}: {self._tail()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(2)
        raise TimeoutError(f"server not up after {timeout}s; see {self.log}: {self._tail()}")

    def pause(self, stopped: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the server."""
        os.killpg(self.proc.pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reaper.terminate()  # it kills what is left of the group
        self.reaper.wait()
        self._out.close()
