"""The core's hot paths against vLLM 0.32's own code and a hand-written floor (issue 19).

Each row runs three sides in one process, taking turns repeat by repeat (the order
rotating), on the same input, and times each with thread CPU time:

* **ours**: leaseproto's core, validation and counters included;
* **vLLM**: vLLM 0.32's own methods, imported from the installed vLLM and called on a
  small stand-in ``self`` holding the attributes they read (``_handle_heartbeat``,
  ``_reap_expired_send_leases``, ``on_new_request``, ``_stop_heartbeat``); where the
  code is a few lines inside a larger method (the heartbeat throttle of
  ``build_connector_meta``, the payload of ``_send_heartbeats``), those lines,
  transcribed with their place named;
* **floor**: a tight hand-written prototype of the same work, in plain Python.

A ratio is taken within each repeat (the sides of one repeat ran under the same load)
and printed as median (min-max) over the repeats: "vs vLLM" is vLLM's time over ours
(above 1: we are ahead), "of floor" is the floor's time over ours (1: at the floor).
``--markdown`` prints the summary table that docs/performance.md and the README carry.

Run it in vLLM's environment with this checkout first on the path::

    PYTHONPATH=. /path/to/vllm-venv/bin/python benchmarks/bench_vllm.py [--repeat 7] [--markdown]

The P step (full scan, plain dict renewals) is ``bench_step.py``: it needs no vLLM.
The rows are in ``_hotpaths_p.py`` (P) and ``_hotpaths_d.py`` (D), the turns and
the ratios in ``_three_sides.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from _common import load, machine, table
from _hotpaths_d import due, payloads, track
from _hotpaths_p import expire, heartbeat, memory
from _three_sides import Sidesets, fmt_ns, fmt_x, run, summarise


def _vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - only in vLLM's environment
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import (  # noqa: PLC0415
            base_scheduler,
            base_worker,
            stats,
        )
    except ImportError as exc:
        sys.exit(f"bench_vllm needs vLLM 0.32 importable (run it in vLLM's venv): {exc}")
    if not vllm.__version__.startswith("0.32"):
        sys.exit(f"bench_vllm compares against vLLM 0.32, found {vllm.__version__}")
    # the reaper logs a WARNING per expired lease: its formatting and I/O are left out
    logging.getLogger(base_worker.__name__).setLevel(logging.ERROR)
    return base_worker, base_scheduler, stats


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7, help="repeats per row (>= 5)")
    ap.add_argument("--markdown", action="store_true", help="print only the summary table")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    args = ap.parse_args(argv)
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    bw, bs, st = _vllm()
    rows: list[tuple[str, str, Callable[[], Sidesets]]] = [
        ("hb512", "heartbeat handling, 512 B messages (ns per id)", lambda: heartbeat(bw, 512)),
        (
            "hb512_checks",
            "heartbeat handling, 512 B, ours without the renewals (ns per id; a limit)",
            lambda: heartbeat(bw, 512, checks_only=True),
        ),
        ("hb4k", "heartbeat handling, 4 KiB messages (ns per id)", lambda: heartbeat(bw, 4096)),
        (
            "hb1",
            "heartbeat handling, one large message (ns per id)",
            lambda: heartbeat(bw, 1 << 20),
        ),
        ("due", "D `due()`, nothing due (ns per call)", due),
        ("pay10", "D payload, 10 ids in one message (ns per id)", lambda: payloads(10, 4096)),
        (
            "pay1k",
            "D payload, 1,000 ids in one message (ns per id)",
            lambda: payloads(1000, 1 << 16),
        ),
        (
            "split",
            "D payload, 1,000 ids split at 512 B (ns per id; vLLM never splits)",
            lambda: payloads(1000, 512),
        ),
        ("track", "D track + untrack (ns per request)", lambda: track(bs)),
        (
            "expire",
            "expire burst, 10k of 100k, one deadline (ns per released lease)",
            lambda: expire(bw, st, spread=False),
        ),
        (
            "expire_spread",
            "expire burst, 10k of 100k, each its own deadline (ns per released lease)",
            lambda: expire(bw, st, spread=True),
        ),
        (
            "expire_records",
            "expire burst, one deadline, each `Release` read (ns per released lease)",
            lambda: expire(bw, st, spread=False, records=True),
        ),
    ]
    wanted = set(filter(None, args.rows.split(",")))
    header = f"{machine()}; {load()}; {args.repeat} repeats, thread CPU time, sides interleaved"
    out = []
    for key, label, make in rows:
        if wanted and key not in wanted:
            continue
        s = summarise(run(make(), args.repeat))
        out.append(
            [
                label,
                fmt_ns(s["ours"]),
                fmt_ns(s["vllm"]),
                fmt_ns(s["floor"]),
                fmt_x(s["vs_vllm"]),
                fmt_x(s["of_floor"]),
            ]
        )
        if not args.markdown:
            print(out[-1], flush=True)
    if not wanted or "memory" in wanted:
        for per_step, what in ((1, "each granted alone"), (16, "16 grants per step")):
            m = memory(per_step=per_step)
            out.append(
                [
                    f"memory per live lease, 100k, {what} (B)",
                    f"{m['ours']:.0f}",
                    f"{m['vllm']:.0f}",
                    f"{m['floor']:.0f}",
                    f"{m['vllm'] / m['ours']:.2f}x",
                    f"{m['floor'] / m['ours']:.2f}x",
                ]
            )
    print(
        f"\nleaseproto against vLLM {sys.modules['vllm'].__version__}'s own code; {header}; "
        "median (min-max) over repeats; ratios per repeat: vs vLLM = vLLM / ours, "
        "of floor = floor / ours\n"
    )
    print(table(["path", "leaseproto", "vLLM 0.32", "floor", "vs vLLM", "of floor"], out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
