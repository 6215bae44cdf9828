"""``leaseproto demo``: the protocol on real workers, in about a minute.

Starts a router, a prefill and a decode worker on loopback (each its own
process, KV moved by NIXL READs) on a compressed timescale, and runs:

1. **surge** (lease policy): more requests than D runs at once, arriving in
   waves, so the last ones wait several lease durations in D's queue.
   Expected: every output identical to the single-process reference, no lease
   expired.
2. **D crash**: requests queued on D, then D gets SIGKILL. Expected: P
   releases every held block within ``lease_extension + heartbeat_interval``
   of the kill; its pool ends with every block free.
3. **surge, fixed timeout** (``--policy fixed``: a timeout of the initial lease,
   no renewals, no NACK; what a naive deployment does). Expected: leases
   expire while requests wait, P sees late transfer notifications, and some
   outputs differ from the reference (D read blocks P had freed and reused).
4. **turns, verified** and 5. **turns, gate-only** (:mod:`.turns`): two-turn
   conversations whose turn 2 reaches P's read later than D's cached lease,
   queued behind a read the gate admitted and P then stalled on past D's
   deadline while D reused the blocks. Expected: ours keeps the queued turns'
   blocks by P's heartbeats and recomputes the stalled one on D's NK (every
   output identical); vLLM's gate-only reads recompute the queued ones (the
   gate) and use the stalled one from reused blocks (its output differs; I14).

Every figure is measured on this run; nothing is assumed.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from ..harness.cluster import Cluster, ClusterSpec
from .settings import DemoSettings, PhaseResult
from .summary import header, table, turns_table, turns_verdict, verdict
from .turns import TurnsResult, converse, stall_s, trace_fates, turn_spec
from .view import DemoDisplay, surge_status

__all__ = ["DemoSettings", "PhaseResult", "run_demo"]


def _prompts(settings: DemoSettings, n: int, salt: int) -> list[list[int]]:
    from ..workers.backend import vocab_size  # noqa: PLC0415 - torch, on use

    rng = random.Random(settings.seed * 1000 + salt)
    v = vocab_size()
    return [[rng.randrange(v) for _ in range(settings.prompt_len)] for _ in range(n)]


def _spec(settings: DemoSettings, policy: str, p_blocks: int) -> ClusterSpec:
    return ClusterSpec(
        kv_lease_duration=settings.kv_lease_duration,
        policy=policy,
        device=settings.device,
        p_blocks=p_blocks,
        d_blocks=256,
        max_running=settings.max_running,
        d_step_time=settings.d_step_time,
        # a fixed timeout breaks I13 on purpose: its traces show where, they fail nothing
        trace_must_pass=policy == "lease",
        cluster_key_file=settings.cluster_key_file if policy == "lease" else None,
    )


def _surge(
    cluster: Cluster,
    settings: DemoSettings,
    result: PhaseResult,
    progress: DemoDisplay,
    reference: Callable[[list[int]], list[int]],
) -> None:
    n = settings.first_wave + settings.waves * settings.wave
    prompts = _prompts(settings, n, salt=1)
    expected = {f"s{i}": reference(p) for i, p in enumerate(prompts)}
    client = cluster.client()
    start = time.monotonic()
    sent = 0
    d0 = cluster.stats(cluster.decode[0])
    try:
        schedule = [(0.0, settings.first_wave)] + [
            (1.0 + k, settings.wave) for k in range(settings.waves)
        ]
        deadline = start + 120.0
        while time.monotonic() < deadline:
            now = time.monotonic() - start
            while schedule and schedule[0][0] <= now:
                _, count = schedule.pop(0)
                for _ in range(count):
                    client.submit(f"s{sent}", prompts[sent], settings.max_tokens)
                    sent += 1
            client.poll(0.1)
            _show(progress, cluster, result.name, len(client.results), n)
            if not schedule and len(client.results) >= n:
                break
        progress.end_status()
        for rid, msg in client.results.items():
            result.answered += 1
            result.longest_wait_s = max(result.longest_wait_s, msg.get("_latency") or 0.0)
            if not msg.get("ok"):
                result.failed += 1
            elif list(msg.get("tokens", [])) == expected[rid]:
                result.identical += 1
            else:
                result.differing += 1
            result.recomputed += bool(msg.get("recomputed"))
        result.requests = n
        if result.answered < n:
            result.notes.append(f"{n - result.answered} requests got no answer in time")
        d1 = cluster.stats(cluster.decode[0])
        result.verified_reads = d1["verified_reads"] - d0["verified_reads"]
        if result.verified_reads:
            waited_us = d1["verdict_wait_us"] - d0["verdict_wait_us"]
            result.verdict_wait_ms = waited_us / result.verified_reads / 1000
    finally:
        client.close()
    _settle(cluster, result, settings)


def _show(progress: DemoDisplay, cluster: Cluster, name: str, answered: int, n: int) -> None:
    try:
        d = cluster.stats(cluster.decode[0], timeout=1.0)
        p = cluster.stats(cluster.prefill[0], timeout=1.0)
    except TimeoutError:
        return
    progress.status(name, surge_status(d, p), done=answered, total=n)


def _settle(cluster: Cluster, result: PhaseResult, settings: DemoSettings) -> None:
    """Wait for P's leases to end (at most one initial lease), then read its figures."""
    deadline = time.monotonic() + settings.kv_lease_duration * 2 + 2.0
    p: dict[str, Any] = {}
    while time.monotonic() < deadline:
        p = cluster.stats(cluster.prefill[0])
        if p["leases_live"] == 0 and p["queued"] == 0:
            break
        time.sleep(0.1)
    t = p.get("table", {})
    result.leases_expired = int(t.get("released_expired", 0))
    result.late_transfers = int(t.get("late_transfers", 0))
    result.nacks = int(p.get("nacks_sent", 0))
    result.blocks_leaked = int(p["blocks_total"]) - int(p["blocks_free"])


def _crash(
    cluster: Cluster, settings: DemoSettings, result: PhaseResult, progress: DemoDisplay
) -> None:
    n = settings.crash_requests
    client = cluster.client()
    p_before = cluster.stats(cluster.prefill[0])["table"]
    try:
        for i, prompt in enumerate(_prompts(settings, n, salt=2)):
            client.submit(f"c{i}", prompt, settings.max_tokens)
        result.requests = n
        # wait until D holds every request and P granted them all at least
        # kv_lease_duration - lease_extension ago, so only renewed leases remain
        cluster.wait_decode_holds(client, n, timeout=30.0)
        time.sleep(settings.kv_lease_duration - settings.lease_extension + 0.2)
        d = cluster.stats(cluster.decode[0])
        p = cluster.stats(cluster.prefill[0])
        progress.line(
            f"  {result.name}: D has {d['waiting']} waiting, {d['running']} running; "
            f"P holds {p['blocks_held']} blocks: SIGKILL D"
        )
        held_at_kill = p["blocks_held"]
        killed_at = cluster.kill(cluster.decode[0])
        bound = settings.lease_extension + settings.heartbeat_interval
        result.reclaim_bound_s = bound
        released_at = cluster.last_release(
            until=killed_at + bound + 10.0,
            on_poll=lambda p, asked: progress.status(
                result.name,
                f"blocks freed; P holds {p['blocks_held']} "
                f"{asked - killed_at:.2f} s after the kill",
                done=max(0, held_at_kill - p["blocks_held"]),
                total=held_at_kill,
            ),
        )
        progress.end_status()
        if released_at is None:
            result.notes.append("P still held blocks 10 s past the bound")
        elif held_at_kill == 0:
            result.notes.append("P held no blocks at the kill: nothing to reclaim")
        else:
            result.reclaim_s = max(0.0, released_at - killed_at)
        client.poll(1.0)
        result.answered = sum(1 for m in client.results.values() if m.get("ok"))
        result.failed = sum(1 for m in client.results.values() if not m.get("ok"))
    finally:
        client.close()
    p = cluster.stats(cluster.prefill[0])
    t = p["table"]
    result.leases_expired = int(t["released_expired"]) - int(p_before["released_expired"])
    result.late_transfers = int(t["late_transfers"]) - int(p_before["late_transfers"])
    result.blocks_leaked = int(p["blocks_total"]) - int(p["blocks_free"])


def run_demo(
    settings: DemoSettings, *, out: TextIO = sys.stdout, json_path: str | None = None
) -> tuple[list[PhaseResult], list[TurnsResult]]:
    from ..workers.backend import reference_tokens  # noqa: PLC0415 - torch, on use

    progress = DemoDisplay(out)

    def reference(prompt: list[int]) -> list[int]:
        return reference_tokens(prompt, settings.max_tokens, device=settings.device)

    def phase(result: PhaseResult, body: Callable[[PhaseResult], None], intro: str) -> None:
        progress.line(f"phase {result.name}: {intro}")
        start = time.monotonic()
        try:
            body(result)
        finally:
            progress.end_status()
        result.seconds = time.monotonic() - start
        progress.verdict(verdict(result, settings))
        results.append(result)

    n = settings.first_wave + settings.waves * settings.wave
    surge = (
        f"{n} requests ({settings.first_wave} at once, then {settings.wave} a second) "
        f"for a decoder that runs {settings.max_running} at once"
    )
    # P's pool holds one surge (all of it may wait on D at once), and no more
    p_blocks = n * -(-settings.prompt_len // ClusterSpec.block_size) + 2
    results: list[PhaseResult] = []
    progress.line(header(settings))
    t0 = time.monotonic()
    progress.line("starting a router, a prefill and a decode worker (lease policy)...")
    with Cluster(_spec(settings, "lease", p_blocks), log_dir=_sub(settings, "lease")) as cluster:
        phase(
            PhaseResult("1 surge", "lease"),
            lambda r: _surge(cluster, settings, r, progress, reference),
            surge,
        )
        phase(
            PhaseResult("2 D SIGKILL", "lease"),
            lambda r: _crash(cluster, settings, r, progress),
            f"{settings.crash_requests} requests queued on the decoder, then SIGKILL",
        )
    traces = {"lease": _trace_line(progress, cluster, "lease")}
    progress.line("restarting the workers with --policy fixed (fixed timeout, no renewals)...")
    with Cluster(_spec(settings, "fixed", p_blocks), log_dir=_sub(settings, "fixed")) as cluster:
        phase(
            PhaseResult("3 surge", "fixed"),
            lambda r: _surge(cluster, settings, r, progress, reference),
            "the same " + surge,
        )
    traces["fixed"] = _trace_line(progress, cluster, "fixed")
    turns = [
        _turns(settings, progress, name, reads, traces)
        for name, reads in (("4 turns", "verified"), ("5 turns", "gate-only"))
        if settings.conversations > 0
    ]
    progress.line("")
    progress.table(*table(results))
    if turns:
        progress.line("")
        progress.table(*turns_table(turns))
    progress.line(f"total {time.monotonic() - t0:.1f} s")
    if json_path is not None:
        Path(json_path).write_text(
            json.dumps(
                {
                    "settings": {
                        **asdict(settings),
                        "heartbeat_interval": settings.heartbeat_interval,
                        "lease_extension": settings.lease_extension,
                    },
                    "phases": [asdict(r) for r in results],
                    "turns": [asdict(r) for r in turns],
                    "trace_check": traces,
                },
                indent=2,
            )
        )
    return results, turns


def _turns(
    settings: DemoSettings,
    progress: DemoDisplay,
    name: str,
    reads: str,
    traces: dict[str, dict[str, Any]],
) -> TurnsResult:
    """A multi-turn phase (:mod:`.turns`) on its own workers; its verdict
    comes after the traces are checked, since some of its figures are in them."""
    result = TurnsResult(name, reads, ttl_s=settings.turn_ttl, stall_s=stall_s(settings))
    how = (
        "P heartbeats D's cached turns and uses a prefix only after D's OK"
        if reads == "verified"
        else "as vLLM 0.32: no heartbeats, only the time gate, the prefix used as read"
    )
    progress.line(f"restarting the workers with --turn-reads {reads} ({how})...")
    spec = turn_spec(settings, reads)
    with Cluster(spec, log_dir=_sub(settings, f"turns-{reads}")) as cluster:
        progress.line(
            f"phase {name}: {settings.conversations} two-turn conversations, D's cached turns "
            f"held {settings.turn_ttl:g} s; P stalls {result.stall_s:g} s on the first turn-2 "
            "read the gate admits, the others queue behind it"
        )
        start = time.monotonic()
        try:
            converse(cluster, settings, result, progress)
        finally:
            progress.end_status()
        result.seconds = time.monotonic() - start
        report = traces[f"turns-{reads}"] = _trace_line(progress, cluster, f"{reads} turn-2")
        trace_fates(cluster.traces, result, settings.turn_ttl)
        result.violations_i14 = int(report.get("by_invariant", {}).get("I14", 0))
    progress.verdict(turns_verdict(result))
    return result


def _trace_line(progress: DemoDisplay, cluster: Cluster, policy: str) -> dict[str, Any]:
    """The workers' traces, checked when the cluster stopped (leaseproto
    check-trace; a violation has raised by now): one line of figures."""
    r = cluster.check_traces(strict=cluster.spec.trace_must_pass)
    found = (
        "no violation"
        if r["ok"]
        else f"{r['violations']} violations, the first {r['first'].rsplit('/', 1)[-1]}"
    )
    progress.line(
        f"trace validation ({policy} workers): {r['events']} events in {r['files']} traces, "
        f"{r['leases']} leases, {r['matched']} notifications matched to their sends, "
        f"{r['uses']} reads used: {found} (checked in {r['seconds']:.2f} s)"
    )
    return r


def _sub(settings: DemoSettings, name: str) -> Path | None:
    return None if settings.log_dir is None else Path(settings.log_dir) / name
