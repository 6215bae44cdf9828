"""Start a router, a prefill engine and a decode engine as processes on this
host (loopback), talk to them, kill them. Used by ``leaseproto demo`` and the
end-to-end tests; each worker is the same ``leaseproto serve`` a deployment
runs.

Workers bind port 0 and report the ports they got in a ready file, so no two
clusters fight over ports; only the NIXL listener needs a port chosen up
front (:func:`leaseproto.adapters.nixl.free_port`).

Every prefill and decode worker writes an event trace (``--trace``) into the
log folder; leaving the cluster runs ``leaseproto check-trace`` on them and
raises :class:`TraceViolation` when they show a step the spec does not allow
(kills, pauses and injected notifications are inputs it explains).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..core.config import LeaseConfig
from ..workers.keys import CurveKeys, curve, load_cluster_key
from ..workers.plane import Msg, call
from .client import RouterClient

__all__ = ["Cluster", "ClusterSpec", "RouterClient", "TraceViolation", "Worker"]

#: Seconds a worker may take to start (import torch and NIXL, register memory).
START_TIMEOUT = 90.0


class TraceViolation(AssertionError):
    """The workers' traces show a step the spec does not allow
    (``leaseproto check-trace``)."""


@dataclass
class ClusterSpec:
    """What to start. Lease settings go to every worker."""

    p_tp: int = 1
    d_tp: int = 1
    kv_lease_duration: float = 3.0
    heartbeat_interval: float | None = None
    lease_extension: float | None = None
    #: D's cached-turn lease (conversations) and the prefix read gate's margin
    decoder_kv_blocks_ttl: float | None = None
    safety_margin: float | None = None
    policy: str = "lease"
    device: str = "cpu"
    p_blocks: int = 256
    d_blocks: int = 256
    block_size: int = 4
    max_running: int = 2
    #: artificial forward-pass time on D per step, seconds (models a busy GPU)
    d_step_time: float = 0.0
    on_kv_loss: str = "recompute"
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)  # role -> extra args
    log_level: str = "INFO"
    #: every prefill and decode worker writes an event trace, checked when the cluster stops
    trace: bool = True
    #: a violation in the traces raises (off: it is only reported, for a baseline that
    #: breaks the protocol on purpose, such as the demo's fixed timeout)
    trace_must_pass: bool = True
    #: every worker and the cluster's own clients use this cluster key (None: none)
    cluster_key_file: str | None = None

    @property
    def config(self) -> LeaseConfig:
        """The effective lease configuration every worker runs with."""
        ttl, margin = self.decoder_kv_blocks_ttl, self.safety_margin
        base = LeaseConfig(self.kv_lease_duration)
        return LeaseConfig(
            self.kv_lease_duration,
            base.decoder_kv_blocks_ttl if ttl is None else ttl,
            heartbeat_interval=self.heartbeat_interval,
            lease_extension=self.lease_extension,
            safety_margin=base.safety_margin if margin is None else margin,
        )

    def lease_args(self) -> list[str]:
        out = ["--kv-lease-duration", str(self.kv_lease_duration), "--policy", self.policy]
        if self.heartbeat_interval is not None:
            out += ["--heartbeat-interval", str(self.heartbeat_interval)]
        if self.lease_extension is not None:
            out += ["--lease-extension", str(self.lease_extension)]
        for flag, value in (
            ("--decoder-kv-blocks-ttl", self.decoder_kv_blocks_ttl),
            ("--safety-margin", self.safety_margin),
        ):
            if value is not None:
                out += [flag, str(value)]
        return out


@dataclass
class Worker:
    """One running worker process."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_path: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"tcp://{self.info.get('host', '127.0.0.1')}:{self.info['port']}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


class Cluster:
    """A router, ``p_tp`` prefill rank processes and ``d_tp`` decode rank
    processes on 127.0.0.1. Use as a context manager: leaving it stops
    everything (SIGTERM, then SIGKILL)."""

    def __init__(self, spec: ClusterSpec, *, log_dir: str | Path | None = None) -> None:
        self.spec = spec
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="leaseproto-")
            log_dir = self._tmp.name
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.prefill: list[Worker] = []
        self.decode: list[Worker] = []
        self.router: Worker | None = None
        self._logs: list[TextIO] = []
        #: every process started, ready or not (stop() ends them all)
        self._spawned: list[Worker] = []
        #: the event traces the workers write (ClusterSpec.trace)
        self.traces: list[Path] = []
        #: what ``leaseproto check-trace`` said of them, once checked
        self.trace_report: dict[str, Any] | None = None
        #: the request plane's keys, when the cluster has a key (pass to ``call``)
        self.curve: CurveKeys | None = curve(load_cluster_key(spec.cluster_key_file))

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> Worker:
        log_path = self.log_dir / f"{name}.log"
        ready = self.log_dir / f"{name}.ready.json"
        with contextlib.suppress(FileNotFoundError):
            ready.unlink()
        logf = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self._logs.append(logf)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            "-m",
            "leaseproto",
            "serve",
            *args,
            "--ready-file",
            str(ready),
            "--log-level",
            self.spec.log_level,
            "--exit-with-parent",
        ]
        if self.spec.cluster_key_file is not None:
            cmd += ["--cluster-key-file", self.spec.cluster_key_file]
        if self.spec.trace and args[0] in ("prefill", "decode"):
            trace = self.log_dir / f"{name}.trace.jsonl"
            self.traces.append(trace)
            cmd += ["--trace", str(trace)]
        proc = subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
        )
        worker = Worker(name, proc, log_path, ready)
        self._spawned.append(worker)
        return worker

    def _await(self, workers: Sequence[Worker], deadline: float) -> None:
        for w in workers:
            while not w.ready_path.exists():
                if not w.alive():
                    raise RuntimeError(
                        f"{w.name} exited during start-up "
                        f"(status {w.proc.returncode}):\n{w.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{w.name} not ready after {START_TIMEOUT:g} s:\n{w.log_tail()}"
                    )
                time.sleep(0.05)
            w.info = json.loads(w.ready_path.read_text())

    def start(self) -> Cluster:
        s = self.spec
        deadline = time.monotonic() + START_TIMEOUT
        common = [*s.lease_args(), "--device", s.device, "--block-size", str(s.block_size)]
        followers = [
            self._spawn(
                f"decode-{r}",
                [
                    "decode",
                    "--rank",
                    str(r),
                    "--tp",
                    str(s.d_tp),
                    "--num-blocks",
                    str(s.d_blocks),
                    *common,
                    *s.extra.get("decode", ()),
                ],
            )
            for r in range(1, s.d_tp)
        ]
        self.prefill = [
            self._spawn(
                f"prefill-{r}",
                [
                    "prefill",
                    "--rank",
                    str(r),
                    "--tp",
                    str(s.p_tp),
                    "--engine-id",
                    "prefill-engine",
                    "--num-blocks",
                    str(s.p_blocks),
                    *common,
                    *s.extra.get("prefill", ()),
                ],
            )
            for r in range(s.p_tp)
        ]
        self._await(followers, deadline)
        leader = self._spawn(
            "decode-0",
            [
                "decode",
                "--rank",
                "0",
                "--tp",
                str(s.d_tp),
                "--num-blocks",
                str(s.d_blocks),
                "--max-running",
                str(s.max_running),
                "--step-time",
                str(s.d_step_time),
                "--on-kv-loss",
                s.on_kv_loss,
                *common,
                *[a for f in followers for a in ("--follower", f.address)],
                *s.extra.get("decode", ()),
            ],
        )
        self.decode = [leader, *followers]
        self._await([*self.prefill, leader], deadline)
        self.router = self._spawn(
            "router",
            [
                "router",
                *[a for p in self.prefill for a in ("--prefill", p.address)],
                "--decode",
                leader.address,
                *s.extra.get("router", ()),
            ],
        )
        self._await([self.router], deadline)
        while True:  # the router answers once it has heard from every worker
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("router never saw every worker:\n" + self.router.log_tail())
            with contextlib.suppress(TimeoutError):
                ping = call(
                    self.router.address, {"op": "ping"}, timeout=min(1.0, left), curve=self.curve
                )
                if ping.get("ready"):
                    return self
            time.sleep(0.05)

    def workers(self) -> list[Worker]:
        return [*self.decode, *self.prefill, *([self.router] if self.router else [])]

    def kill(self, worker: Worker) -> float:
        """SIGKILL ``worker``; returns ``time.monotonic()`` just before the signal."""
        t = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait(timeout=10)
        return t

    def stop(self) -> None:
        """End every process this cluster started (SIGTERM, then SIGKILL after 5 s),
        those still starting included. A second Ctrl-C does not cut this short."""
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for w in self._spawned:
                if w.alive():
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.terminate()
            for w in self._spawned:
                try:
                    w.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait(timeout=5)
        finally:
            if main:
                signal.signal(signal.SIGINT, old)
        for f in self._logs:
            f.close()
        self._logs.clear()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def check_traces(self, *, strict: bool = True) -> dict[str, Any]:
        """Stop the workers and run ``leaseproto check-trace`` on their traces
        (once); its JSON summary.

        Raises:
            TraceViolation: the traces show a transition the spec does not allow
                (``strict``), or the check could not run.
        """
        if self.trace_report is None:
            self.stop()
            files = [str(p) for p in self.traces if p.exists()]
            proc = subprocess.run(
                [sys.executable, "-m", "leaseproto", "check-trace", "--json", *files],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                self.trace_report = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError) as exc:
                raise TraceViolation(
                    f"check-trace failed (status {proc.returncode}): {proc.stderr}"
                ) from exc
            self.trace_report["command"] = f"leaseproto check-trace {' '.join(files)}"
        if strict and not self.trace_report["ok"]:
            raise TraceViolation(
                f"the traces in {self.log_dir} break the spec: {self.trace_report['first']}"
                f" ({self.trace_report['command']})"
            )
        return self.trace_report

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.stop()
            if self.spec.trace and exc_type is None:
                try:
                    self.check_traces(strict=self.spec.trace_must_pass)
                except TraceViolation as violation:
                    if self._tmp is None:
                        raise
                    kept = tempfile.mkdtemp(prefix="leaseproto-violation-")
                    shutil.copytree(self.log_dir, kept, dirs_exist_ok=True)
                    raise TraceViolation(f"{violation} [logs and traces kept in {kept}]") from None
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()

    # -- requests -------------------------------------------------------------------------
    def stats(self, worker: Worker, timeout: float = 5.0) -> Msg:
        return call(worker.address, {"op": "stats"}, timeout=timeout, curve=self.curve)

    def client(self) -> RouterClient:
        assert self.router is not None, "cluster not started"
        return RouterClient(self.router.address, curve=self.curve)

    def wait_decode_holds(self, client: RouterClient, n: int, *, timeout: float) -> bool:
        """Wait until the first decode worker tracks or has completed ``n``
        requests, draining ``client`` meanwhile; ``False`` at the timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.stats(self.decode[0])
            if d["tracker"]["tracked"] + d["completed"] >= n:
                return True
            client.poll(0.05)
        return False

    def last_release(
        self, *, until: float, on_poll: Callable[[Msg, float], None] | None = None
    ) -> float | None:
        """Poll the first prefill worker until it holds no block and no lease;
        returns when (``time.monotonic()``) it released its last one, or
        ``None`` if it still held some at ``until``."""
        while time.monotonic() < until:
            p = self.stats(self.prefill[0])
            asked = time.monotonic()
            if p["blocks_held"] == 0 and p["leases_live"] == 0:
                return asked - float(p.get("since_last_release") or 0.0)
            if on_poll is not None:
                on_poll(p, asked)
            time.sleep(0.02)
        return None
