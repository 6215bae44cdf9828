"""``leaseproto demo``: the main job. Real prefill, decode and router processes
on loopback, a surge, a decode crash, the same surge under a fixed timeout,
and two-turn conversations read verified and gate-only, with the figures
measured on this machine (see :mod:`leaseproto.demo.run`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._errors import check_writable, fail, missing_extra
from ._flag_types import device, device_problem, non_negative_float, non_negative_int, positive_int

__all__ = ["register"]


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run P, D and a router on loopback: surge, D crash, fixed-timeout surge, "
        "multi-turn conversations",
        description="Start a router, a prefill worker and a decode worker on this machine "
        "(KV blocks in torch, moved by NIXL READs) on a compressed timescale and "
        "run five phases: a surge under the lease protocol, a SIGKILL of the "
        "decode worker, the same surge under a fixed timeout, and two-turn "
        "conversations whose turn-2 prefix P reads from D, verified (ours) and "
        "gate-only (vLLM 0.32's bidirectional mode) on the same schedule. Prints "
        "two tables of what it measured; takes about a minute and a half.",
    )
    p.add_argument(
        "--device",
        type=device,
        default="cpu",
        help="torch device for KV blocks (cpu, cuda, cuda:N)",
    )
    p.add_argument(
        "--kv-lease-duration",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="initial lease (default 3 s: a compressed timescale)",
    )
    p.add_argument(
        "--max-running", type=positive_int, default=2, help="requests D decodes at once (default 2)"
    )
    p.add_argument(
        "--first-wave",
        type=positive_int,
        default=16,
        help="requests in the first wave of a surge (default 16)",
    )
    p.add_argument(
        "--waves", type=non_negative_int, default=5, help="later waves, one a second (default 5)"
    )
    p.add_argument(
        "--wave", type=positive_int, default=4, help="requests per later wave (default 4)"
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=12,
        help="tokens to decode per request (default 12)",
    )
    p.add_argument(
        "--step-time",
        type=non_negative_float,
        default=0.08,
        metavar="SECONDS",
        help="modelled forward-pass time of one decode step (default 0.08)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write the figures of every phase as JSON"
    )
    p.add_argument(
        "--cluster-key-file",
        default=None,
        metavar="PATH",
        help="run the lease phases with this cluster key (as leaseproto serve "
        "--cluster-key-file; the fixed-timeout phase runs without)",
    )
    p.add_argument(
        "--conversations",
        type=non_negative_int,
        default=3,
        help="two-turn conversations of the multi-turn phases (default 3; 0 skips them)",
    )
    p.add_argument(
        "--log-dir",
        default=None,
        metavar="DIR",
        help="keep the workers' logs here (default: a temporary directory)",
    )
    p.set_defaults(func=run)


def _problem(args: argparse.Namespace, prompt_len: int) -> str | None:
    """What the flags' types cannot check and a worker would refuse: the lease
    settings (the rules of :class:`~leaseproto.LeaseConfig`), the device on this
    machine, a request longer than the model."""
    from ..core.config import LeaseConfig  # noqa: PLC0415
    from ..toymodel.tiny_decoder import ModelConfig  # noqa: PLC0415

    try:
        LeaseConfig(args.kv_lease_duration)
    except ValueError as exc:
        return f"--kv-lease-duration: {exc}"
    positions = ModelConfig().max_positions
    if prompt_len + args.max_tokens > positions:
        return (
            f"--max-tokens {args.max_tokens}: a {prompt_len}-token prompt and "
            f"{args.max_tokens} new tokens exceed the model's {positions} positions"
        )
    return device_problem(args.device)


def run(args: argparse.Namespace) -> int:
    try:
        from ..demo.run import DemoSettings, run_demo  # noqa: PLC0415
        from ..harness.cluster import TraceViolation  # noqa: PLC0415
    except ImportError as exc:
        return fail(
            "demo",
            f"{missing_extra(exc)}\nthe demo needs torch, NIXL and the serve extra: "
            "pip install torch==2.13.0 && pip install 'leaseproto[all]'",
        )
    try:
        if args.json is not None:
            check_writable(Path(args.json), folder=False)
        if args.log_dir is not None:
            check_writable(Path(args.log_dir), folder=True)
        from ..workers.keys import load_cluster_key  # noqa: PLC0415

        load_cluster_key(args.cluster_key_file)  # a bad file fails here, not in a phase
    except ValueError as exc:
        return fail("demo", str(exc))
    problem = _problem(args, DemoSettings.prompt_len)
    if problem is not None:  # before any worker starts, not from a child after 20 s
        return fail("demo", problem)
    settings = DemoSettings(
        device=args.device,
        kv_lease_duration=args.kv_lease_duration,
        max_running=args.max_running,
        first_wave=args.first_wave,
        waves=args.waves,
        wave=args.wave,
        max_tokens=args.max_tokens,
        d_step_time=args.step_time,
        log_dir=args.log_dir,
        cluster_key_file=args.cluster_key_file,
        conversations=args.conversations,
    )
    try:
        results, turns = run_demo(settings, json_path=args.json)
    except (RuntimeError, TimeoutError) as exc:
        print(f"leaseproto demo failed: {exc}", file=sys.stderr)
        return 1
    except TraceViolation as exc:  # the workers' traces break the spec (check-trace)
        print(f"leaseproto demo failed trace validation: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the clusters' exits have stopped every worker
        print("\nleaseproto demo: interrupted; every worker process was stopped", file=sys.stderr)
        return 130
    ok = (
        results[0].identical == results[0].requests
        and results[0].leases_expired == 0
        and results[1].reclaim_s is not None
        and results[1].reclaim_bound_s is not None
        and results[1].blocks_leaked == 0
        # ours: every conversation right, no cached turn lost while its turn 2 waited
        and all(
            t.identical == t.conversations and t.expired_waiting == 0
            for t in turns
            if t.reads == "verified"
        )
    )
    return 0 if ok else 1
