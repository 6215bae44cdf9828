"""Real vLLM P/D engines side by side: stock ``NixlConnector`` and ``LeaseprotoConnector``.

Builds a tiny random model locally (no downloads), starts a real vLLM prefill server and
decode server on loopback with NIXL (UCX) on CPU, and routes completions the way vLLM's
toy proxy does (prefill on P with ``do_remote_decode``, then decode on D with P's
``kv_transfer_params``; this script is the router). The same schedule runs for each pair
of connectors: stock/stock, ours/ours, ours P + stock D, stock P + ours D:

1. surge: more requests than D runs at once, so some wait in D's queue for several
   initial leases;
2. stall: D is SIGSTOPped past the lease extension while requests wait in its queue and
   P serves other prompts into the freed blocks, then SIGCONTed;
3. kill: D is SIGKILLed with requests queued; the time from the kill to P's last
   expiry is measured against its bound (``lease_extension + heartbeat_interval``, or the
   initial lease for a lease never renewed).

Per run it prints requests, completions identical to a single-instance run of the same
model (P serving the prompt whole), leases expired on P, late reads P detected, reads D
used without verification, reads D recomputed, and kill -> last free. ``--json FILE``
writes the same. Run with the vLLM environment of docs/vllm.md::

    python benchmarks/vllm_pd.py --json vllm_pd.json

The runs are in ``_vllm_runs.py``, the pairs' servers and requests in ``_vllm_pairs.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from _common import machine, table
from _reaper import die_with_parent
from _vllm_latency import latency_table, verdict_table
from _vllm_pairs import PAIRS
from _vllm_runs import run_latency, run_pair, run_two_turns
from _vllm_server import LEASE
from _vllm_traces import report_traces
from _vllm_turns import two_turn_table

from leaseproto.integrations.vllm.tinymodel import build_tiny_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="*", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument(
        "--two-turn", action="store_true", help="only two-turn conversations (bidirectional)"
    )
    ap.add_argument("--conversations", type=int, default=4, help="two-turn conversations per pair")
    ap.add_argument(
        "--first-conversation", type=int, default=0, help="number of the first conversation"
    )
    ap.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="two-turn: times a pair that failed a conversation is started afresh for it",
    )
    ap.add_argument(
        "--latency",
        action="store_true",
        help="only D's leg (READ + first token), stock and ours interleaved",
    )
    ap.add_argument("--rounds", type=int, default=60, help="requests per pair for --latency")
    ap.add_argument(
        "--verdict-wait",
        type=float,
        help="--latency: our D's verdict_wait in seconds (default: the connector's; 0: no wait)",
    )
    ap.add_argument(
        "--idle-wait",
        type=float,
        help="--latency: our P's idle_wait in seconds (default: the connector's; 0: no wait)",
    )
    ap.add_argument(
        "--one-pair-at-a-time",
        action="store_true",
        help="--latency: stop (SIGSTOP) the pair not measured while the other serves a request",
    )
    ap.add_argument(
        "--lease",
        type=int,
        default=LEASE,
        help=f"--latency: every engine's kv_lease_duration in s (default {LEASE}; at least 6)",
    )
    args = ap.parse_args()
    if args.lease < 6:  # vLLM's heartbeat interval would be 0 (our engines refuse it: rule V1)
        ap.error(f"--lease must be at least 6, got {args.lease}")
    die_with_parent()  # and each server with this process (_reaper)
    if args.latency:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
        model = build_tiny_model(work / "tiny-qwen3")
        res = run_latency(
            model,
            work,
            args.rounds,
            args.verdict_wait,
            args.lease,
            idle_wait=args.idle_wait,
            one_at_a_time=args.one_pair_at_a_time,
        )
        load = res["load"]
        res["one_pair_at_a_time"] = args.one_pair_at_a_time
        alone = "; the other pair stopped meanwhile" if args.one_pair_at_a_time else ""
        print(
            f"kv_lease_duration {args.lease} s; load {min(load):.1f}-{max(load):.1f}{alone}; "
            f"{machine()}"
        )
        print(table(*latency_table(res)))
        print(table(*verdict_table(res, args.verdict_wait, args.idle_wait)))
        print("leaseproto D counters:", res["d_counters"])
        print("leaseproto P counters:", res["p_counters"])
        if res["trace"] is not None:
            print("verdicts:", res["trace"].get("verdicts"))
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return
    if args.two_turn:
        work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
        model = build_tiny_model(work / "tiny-qwen3")
        turns = {
            n: run_two_turns(
                n,
                model,
                work,
                args.conversations,
                args.max_tokens,
                first=args.first_conversation,
                restarts=args.restarts,
            )
            for n in args.pairs
        }
        print(f"kv_lease_duration {LEASE} s, bidirectional_kv_xfer; {machine()}")
        print(table(*two_turn_table(turns)))
        report_traces(turns, args.json)
        return

    work = args.workdir or Path(tempfile.mkdtemp(prefix="vllm_pd-"))
    model = build_tiny_model(work / "tiny-qwen3")
    results = {
        name: run_pair(name, model, work, args.requests, args.max_tokens) for name in args.pairs
    }
    header = (
        "pair",
        "phase",
        "requests",
        "identical",
        "wrong",
        "expired",
        "late reads (P)",
        "unverified (D)",
        "recomputed (D)",
        "kill -> last free s",
        "last grant -> last free s",
    )
    out = []
    for name, rows in results.items():
        for phase in ("surge", "stall", "kill"):
            r = rows.get(phase)
            if r is None:
                continue
            free = r["kill_to_last_free_s"]
            out.append(
                (
                    name,
                    phase,
                    r["requests"],
                    f"{r['identical']}/{r['completed']}",
                    r["wrong"],
                    r["expired"],
                    r["late_reads"],
                    "-" if r["unverified"] is None else r["unverified"],
                    "-" if r["recomputed"] is None else r["recomputed"],
                    "-" if free is None else str(free),
                    "-"
                    if r.get("last_grant_to_last_free_s") is None
                    else f"{r['last_grant_to_last_free_s']} (bound {r['bound_s']})",
                )
            )
    print(f"kv_lease_duration {LEASE} s; {machine()}")
    print(table(header, out))
    report_traces(results, args.json)


if __name__ == "__main__":
    main()
