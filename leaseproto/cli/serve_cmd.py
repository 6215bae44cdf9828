"""``leaseproto serve prefill|decode|router``: run one worker process.

The same workers ``leaseproto demo`` starts on loopback run across machines:
give each worker the address peers reach it at (``--host``), and NIXL/UCX
carries the KV between hosts. Every worker serves Prometheus metrics on
``--metrics-port`` (``/metrics``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..workers.notifications import MAX_INCOMING_BYTES
from ._errors import fail, missing_extra
from ._flag_types import (
    address,
    device,
    device_problem,
    metrics_port,
    non_negative_float,
    non_negative_int,
    port_or_zero,
    positive_float,
    positive_int,
)
from ._lease_flags import add_extra_config_flag, add_lease_flags, config_from_args

__all__ = ["address", "register"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}: choose one of {', '.join(LOG_LEVELS)}"
        )
    return level


def _lease_flags(p: argparse.ArgumentParser, *, router: bool = False) -> None:
    title = (
        "lease settings (checked; the router holds no lease, so one set of flags serves every role)"
        if router
        else "lease settings (must match on P and D)"
    )
    g = p.add_argument_group(title)
    add_lease_flags(g)
    add_extra_config_flag(g)
    if router:
        return
    g.add_argument(
        "--policy",
        choices=("lease", "fixed"),
        default="lease",
        help="lease: heartbeats renew, late reads are NACKed; fixed: a fixed "
        "timeout of kv_lease_duration, no renewals, no NACK (a naive "
        "deployment, for comparison)",
    )


def _common(p: argparse.ArgumentParser, *, nixl: bool = True) -> None:
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)"
    )
    p.add_argument(
        "--port",
        type=port_or_zero,
        default=0,
        help="request-plane port (ZeroMQ); 0 picks a free one",
    )
    p.add_argument(
        "--metrics-port",
        type=metrics_port,
        default=0,
        help="Prometheus /metrics port; 0 picks a free one, -1 disables",
    )
    if nixl:
        p.add_argument(
            "--nixl-port",
            type=port_or_zero,
            default=0,
            help="NIXL metadata listener port; 0 picks a free one",
        )
        p.add_argument(
            "--device",
            type=device,
            default="cpu",
            help="torch device for KV blocks (cpu, cuda, cuda:N)",
        )
        p.add_argument("--num-blocks", type=positive_int, default=256, help="KV blocks in the pool")
        p.add_argument("--block-size", type=positive_int, default=4, help="tokens per KV block")
        p.add_argument("--rank", type=non_negative_int, default=0, help="this process's TP rank")
        p.add_argument("--tp", type=positive_int, default=1, help="ranks of this engine")
        p.add_argument(
            "--max-incoming-notification-bytes",
            type=positive_int,
            default=MAX_INCOMING_BYTES,
            metavar="BYTES",
            help="drop and count larger incoming NIXL notifications (default %(default)s)",
        )
        p.add_argument(
            "--trace",
            default=None,
            metavar="FILE",
            help="write a structured event trace (JSON lines: grants, notifications sent "
            "and received, renewals, releases, verdicts, expiries) for leaseproto "
            "check-trace and leaseproto trace; off by default",
        )
        p.add_argument(
            "--model-seed",
            type=int,
            default=0,
            help="seed of the tiny model's weights (same on P and D)",
        )
    _lease_flags(p, router=not nixl)
    p.add_argument(
        "--cluster-key-file",
        default=None,
        metavar="PATH",
        help="authenticate the control plane with the key in this file (at least 16 "
        "bytes, the same file on every worker and client): leaseproto's NIXL messages "
        "carry an HMAC-SHA256 MAC, the request plane runs ZeroMQ CURVE; without it the "
        "control plane is unauthenticated (spec §10.3)",
    )
    p.add_argument(
        "--ready-file",
        default=None,
        metavar="PATH",
        help="write the bound ports here as JSON once serving",
    )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default="INFO",
        metavar="LEVEL",
        help=f"one of {', '.join(LOG_LEVELS)}; DEBUG adds a line per lease renewal",
    )
    p.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one exits (for launchers)",
    )


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="run one worker: prefill, decode or router",
        description="Run one worker process with a single-threaded engine loop.",
    )
    roles = p.add_subparsers(dest="role", metavar="ROLE")  # CommandParser names a missing one
    pre = roles.add_parser("prefill", help="a prefill rank: prefill, grant leases, serve KV")
    _common(pre)
    pre.add_argument(
        "--engine-id",
        default="prefill-engine",
        help="id shared by every rank of this prefill engine",
    )
    pre.add_argument(
        "--stall-after-prefix-read",
        dest="prefix_stall",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="fault injection (tests, demo): stall the whole loop this long right after "
        "posting a prefix READ of D, i.e. after the read gate admitted it",
    )
    pre.add_argument(
        "--stall-after-prefix-gate",
        dest="prefix_gate_stall",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="fault injection (tests, demo): once the read gate admits a prefix READ of D, "
        "stop working on that request this long (no heartbeat for it, READ not posted, the "
        "queue waits behind it) while the loop goes on serving NIXL",
    )
    pre.add_argument(
        "--stall-prefix-reads",
        dest="prefix_stalls",
        type=positive_int,
        default=None,
        metavar="N",
        help="the stalls above hit only the first N prefix reads admitted (default: every one)",
    )
    pre.add_argument(
        "--turn-reads",
        choices=("verified", "gate-only"),
        default="verified",
        help="verified: heartbeat D's cached turn while the turn-2 request waits and use "
        "the prefix only after D's OK (I14, I16); gate-only: what vLLM 0.32 does in "
        "bidirectional mode (no heartbeats, only the time gate before the READ, the "
        "prefix used as read), for comparison",
    )
    dec = roles.add_parser("decode", help="a decode rank: queue, heartbeat, read KV, decode")
    _common(dec)
    dec.add_argument(
        "--engine-id",
        default="decode-engine",
        help="id shared by every rank of this decode engine (a label of its metrics)",
    )
    dec.add_argument(
        "--max-running",
        type=positive_int,
        default=4,
        help="most requests decoding at once; the rest wait in the queue",
    )
    dec.add_argument(
        "--step-time",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="extra time per decode step (models a busy accelerator)",
    )
    dec.add_argument(
        "--on-lost-kv",
        "--on-kv-loss",
        dest="on_kv_loss",
        choices=("recompute", "fail", "error"),
        default="recompute",
        help="when P's KV is lost or unconfirmed (P gone, NK, no verdict in time): "
        "recompute locally or fail the request ('error' is the old name of 'fail')",
    )
    dec.add_argument(
        "--unverified-reads",
        action="store_true",
        help="use what was read without waiting for P's verdict, as stock vLLM does "
        "(unsafe: only to measure what verified reads cost)",
    )
    dec.add_argument(
        "--lease-mismatch",
        choices=("refuse", "warn"),
        default="refuse",
        help="when a P engine's advertised lease settings cannot work with this "
        "decoder's heartbeat interval (spec T1/T2, checked at first contact): refuse its "
        "requests with the reason, or warn and serve them",
    )
    dec.add_argument(
        "--follower",
        action="append",
        type=address,
        default=[],
        metavar="ADDRESS",
        help="request-plane address of decode rank 1, 2, ... (rank 0 only)",
    )
    rt = roles.add_parser("router", help="the router: P first, then D")
    _common(rt, nixl=False)
    rt.add_argument(
        "--prefill",
        action="append",
        type=address,
        default=[],
        required=True,
        metavar="ADDRESS",
        help="a prefill rank's address, in rank order",
    )
    rt.add_argument(
        "--decode",
        type=address,
        required=True,
        metavar="ADDRESS",
        help="the decode engine's rank-0 address",
    )
    rt.add_argument(
        "--request-timeout",
        type=positive_float,
        default=120.0,
        metavar="SECONDS",
        help="a request not answered this long after it arrived fails",
    )
    p.set_defaults(func=run)


def _write_ready(path: str | None, info: dict[str, Any]) -> None:
    if path is None:
        return
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps({**info, "pid": os.getpid()}))
    tmp.replace(path)


def _worker(args: argparse.Namespace) -> Any:
    """Build the worker the flags name (binds its ports)."""
    metrics_port = None if args.metrics_port < 0 else args.metrics_port
    config = config_from_args(args)
    if args.role == "router":
        from ..workers.keys import load_cluster_key  # noqa: PLC0415
        from ..workers.router import Router, RouterOptions  # noqa: PLC0415

        return Router(
            RouterOptions(
                host=args.host,
                port=args.port,
                prefill=args.prefill,
                decode=args.decode,
                metrics_port=metrics_port,
                request_timeout=args.request_timeout,
                cluster_key=load_cluster_key(args.cluster_key_file),
            )
        )
    problem = device_problem(args.device)
    if problem is not None:
        raise ValueError(problem)
    if args.role == "prefill":
        from ..workers.prefill import PrefillOptions, PrefillWorker  # noqa: PLC0415

        return PrefillWorker(
            PrefillOptions.from_args(
                args,
                config,
                metrics_port,
                engine_id=args.engine_id,
                prefix_stall=args.prefix_stall,
                turn_reads=args.turn_reads,
                prefix_gate_stall=args.prefix_gate_stall,
                prefix_stalls=args.prefix_stalls,
            )
        )
    from ..workers.decode_state import DecodeOptions  # noqa: PLC0415

    opts = DecodeOptions.from_args(
        args,
        config,
        metrics_port,
        max_running=args.max_running,
        step_time=args.step_time,
        on_kv_loss=args.on_kv_loss,
        verify_reads=not args.unverified_reads,
        followers=list(args.follower),
        lease_mismatch=args.lease_mismatch,
        engine_id=args.engine_id,
    )
    if opts.rank == 0:
        from ..workers.decode import DecodeWorker  # noqa: PLC0415

        return DecodeWorker(opts)
    from ..workers.decode_follower import DecodeFollower  # noqa: PLC0415

    return DecodeFollower(opts)


def _start_error(exc: Exception, args: argparse.Namespace) -> str | None:
    """The message for a failure to start, or None if ``exc`` is a bug."""
    if isinstance(exc, ImportError):
        return missing_extra(exc)
    if isinstance(exc, (ValueError, OSError)):
        return str(exc)
    zmq = sys.modules.get("zmq")
    if zmq is not None and isinstance(exc, zmq.ZMQError):  # a bind that failed
        return f"cannot listen on {args.host}:{args.port}: {exc} (--port 0 picks a free port)"
    return None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    worker: Any
    try:
        worker = _worker(args)
    except Exception as exc:
        message = _start_error(exc, args)
        if message is None:
            raise
        return fail(f"serve {args.role}", message)

    def _stop(signum: int, frame: object) -> None:
        worker.stop(f"{signal.Signals(signum).name} received")

    if args.exit_with_parent:
        worker.parent_pid = os.getppid()
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    _write_ready(args.ready_file, worker.ready_info())
    worker.run()
    return 0
