"""``leaseproto demo``'s multi-turn phases (issue 18, spec §2.8): the same
schedule under P's two ways of reading a turn-2 prefix from D.

The schedule (:func:`converse`), on a cluster started by :func:`turn_spec`:

1. turn 1 of ``conversations`` conversations at once; D caches each turn under a
   lease of ``decoder_kv_blocks_ttl`` (``turn_ttl``, short like the demo's 3 s
   leases) and its pool is left with fewer free blocks than a waiting request
   needs (``d_blocks``);
2. at once: a few single-turn requests that wait on D for blocks, then turn 2 of
   every conversation, the first one's ahead of the rest in P's queue. The gate
   admits its read, then P stalls on it (``--stall-after-prefix-gate``, the
   first read only) past D's deadline: nothing is prefilled meanwhile, so the
   other turn-2 requests queue in P, for longer than the cached lease;
3. D frees the blocks of every cached lease that ran out and gives them to the
   requests waiting for blocks, whose READs of P overwrite them.

``verified`` (ours, I14 and I16): P heartbeats D for every queued turn-2 request,
so only the stalled read's lease runs out; D answers its late transfer-done
``NK`` and P recomputes that prefix. ``gate-only`` (vLLM 0.32's bidirectional
mode): nothing renews D's leases, so the queued reads are refused by the gate
(recomputed) and the stalled one is used as read, from reused blocks.

Every figure comes from the run: the answers against the single-process
reference, P's and D's counters, and the workers' traces (:func:`trace_fates`:
what became of each cached lease P tried to read, on the one monotonic clock
of this host); ``leaseproto check-trace`` counts the violations (I14).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..harness.cluster import Cluster, ClusterSpec
from .view import DemoDisplay, turns_status

if TYPE_CHECKING:
    from .settings import DemoSettings

__all__ = ["TurnsResult", "converse", "stall_s", "trace_fates", "turn_spec"]

#: Tokens of turn 2 and of each request waiting on D (short: they only fill time).
_SHORT = 4
#: New tokens the user adds to each conversation for turn 2.
_NEW = 4
_SAID = {
    "identical": "identical to the reference",
    "differing": "DIFFERENT from the reference",
    "failed": "failed",
}


@dataclass
class TurnsResult:
    name: str
    #: P's turn-2 reads: ``verified`` or ``gate-only``
    reads: str
    conversations: int = 0
    identical: int = 0  # turn-2 answers equal to the reference
    differing: int = 0
    failed: int = 0
    #: turn-2 prefixes by what P did (P's counters)
    verified: int = 0
    unverified: int = 0
    recomputed: dict[str, int] = field(default_factory=dict)
    #: heartbeats P sent D for queued turn-2 requests; D's NK answers to P's reads
    heartbeats: int = 0
    nk: int = 0
    #: D's cached leases P tried to read, by fate (traces): released on P's read
    #: later than their fixed TTL (kept by P's heartbeats); expired before P's
    #: gate admitted the read; expired after it (during the injected stall)
    kept: int = 0
    expired_waiting: int = 0
    expired_stalled: int = 0
    #: per turn-2 request: seconds from D caching turn 1 to P's READ or its gate's refusal
    reached_s: list[float] = field(default_factory=list)
    #: the stalled read: what P did with it, and whether that answer was right
    stalled: str = ""
    #: check-trace's violations of I14 (a prefix used from freed or reused blocks)
    violations_i14: int = 0
    ttl_s: float = 0.0
    stall_s: float = 0.0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _blocks(tokens: int) -> int:
    return -(-tokens // ClusterSpec.block_size)


def _sizes(settings: DemoSettings) -> tuple[int, int, int]:
    """(blocks D caches per turn 1, blocks of a request waiting on D, how many
    of those): a waiting request needs more than D has free while the turns are
    cached, and they are enough to take every cached turn's blocks once freed."""
    cached = _blocks(settings.prompt_len + settings.max_tokens - 1)
    filler = cached + 2
    count = -(-settings.conversations * cached // filler) + 1
    return cached, filler, count


def stall_s(settings: DemoSettings) -> float:
    """How long P stalls on the read the gate admitted: a second past D's
    deadline, whether D's lease ran from its grant or P's last heartbeat."""
    return max(settings.turn_ttl, settings.lease_extension) + 1.0


def turn_spec(settings: DemoSettings, reads: str) -> ClusterSpec:
    cached, filler, _ = _sizes(settings)
    return ClusterSpec(
        kv_lease_duration=settings.kv_lease_duration,
        decoder_kv_blocks_ttl=settings.turn_ttl,
        safety_margin=settings.turn_margin,
        device=settings.device,
        p_blocks=256,
        # every cached turn, and one block less than a waiting request needs
        d_blocks=settings.conversations * cached + filler - 1,
        max_running=64,  # D's blocks, not its slots, hold the waiting requests back
        d_step_time=settings.d_step_time,
        trace_must_pass=reads == "verified",
        cluster_key_file=settings.cluster_key_file,
        extra={
            "prefill": [
                "--turn-reads",
                reads,
                "--stall-after-prefix-gate",
                f"{stall_s(settings):g}",
                "--stall-prefix-reads",
                "1",
            ]
        },
    )


def converse(
    cluster: Cluster, settings: DemoSettings, result: TurnsResult, progress: DemoDisplay
) -> None:
    """Run the schedule (the module's docstring) and count the answers."""
    from ..workers.backend import reference_tokens, vocab_size  # noqa: PLC0415 - torch, on use

    n = settings.conversations
    _, filler, fillers = _sizes(settings)
    rng = random.Random(settings.seed * 1000 + 4)
    v = vocab_size()
    first = [[rng.randrange(v) for _ in range(settings.prompt_len)] for _ in range(n)]
    size = filler * ClusterSpec.block_size  # fills its blocks: every one is written
    waiting = [[rng.randrange(v) for _ in range(size)] for _ in range(fillers)]
    client = cluster.client()
    deadline = time.monotonic() + 120.0
    try:
        for i, prompt in enumerate(first):
            client.submit(f"t{i}.1", prompt, settings.max_tokens, conversation=f"t{i}")
        _wait(client, cluster, progress, result, n=n, deadline=deadline)
        second: list[list[int]] = []
        for i, prompt in enumerate(first):
            r = client.results[f"t{i}.1"]
            if not r.get("ok") or list(r["tokens"]) != reference_tokens(
                prompt, settings.max_tokens, device=settings.device
            ):
                result.notes.append(f"turn 1 of t{i} differs from the reference or failed")
            second.append([*prompt, *r.get("tokens", []), *(rng.randrange(v) for _ in range(_NEW))])
        for j, prompt in enumerate(waiting):
            client.submit(f"w{j}", prompt, _SHORT)
        for i, prompt in enumerate(second):
            client.submit(f"t{i}.2", prompt, _SHORT, conversation=f"t{i}")
        _wait(client, cluster, progress, result, n=len(client.sent), deadline=deadline)
        result.conversations = n
        for i, prompt in enumerate(second):
            got = client.results.get(f"t{i}.2")
            right = reference_tokens(prompt, _SHORT, device=settings.device)
            if got is None or not got.get("ok"):
                outcome = "failed"
            elif list(got["tokens"]) == right:
                outcome = "identical"
            else:
                outcome = "differing"
            setattr(result, outcome, getattr(result, outcome) + 1)
            if i == 0:  # the read P stalled on
                result.stalled = f"{_prefix_use(got)}, output {_SAID[outcome]}"
    finally:
        client.close()
    p = cluster.stats(cluster.prefill[0])
    d = cluster.stats(cluster.decode[0])
    result.verified = int(p["prefix_verified"])
    result.unverified = int(p["prefix_unverified"])
    result.recomputed = {
        k.removeprefix("prefix_recomputed_"): int(x)
        for k, x in p.items()
        if k.startswith("prefix_recomputed_") and x
    }
    result.heartbeats = int(p["prefix_heartbeats_sent"])
    result.nk = int(d["turn_verdicts_sent"]["nk"])


def _wait(
    client: Any,
    cluster: Cluster,
    progress: DemoDisplay,
    result: TurnsResult,
    *,
    n: int,
    deadline: float,
) -> None:
    while len(client.results) < n and time.monotonic() < deadline:
        client.poll(0.1)
        try:
            d = cluster.stats(cluster.decode[0], timeout=1.0)
            p = cluster.stats(cluster.prefill[0], timeout=1.0)
        except TimeoutError:
            continue
        progress.status(result.name, turns_status(d, p), done=len(client.results), total=n)
    progress.end_status()
    if len(client.results) < n:
        result.notes.append(f"{n - len(client.results)} requests got no answer in time")


def _prefix_use(r: dict[str, Any] | None) -> str:
    """What P did with a turn-2 request's prefix, as its answer says."""
    prefix = (r or {}).get("prefix") or {}
    if prefix.get("recomputed"):
        return f"prefix recomputed ({', '.join(prefix['recomputed'])})"
    return "prefix used after D's OK" if prefix.get("verified") else "prefix used as read"


def trace_fates(paths: Sequence[Path], result: TurnsResult, ttl: float) -> None:
    """What became of each cached lease P tried to read, from the traces: D's
    ``grant``/``release`` of the lease, P's ``stall``/``read`` (the gate admitted
    it) and ``use``/``recompute``."""
    grants: dict[str, float] = {}
    releases: dict[str, tuple[str, float, float]] = {}
    admitted: dict[str, float] = {}  # the gate let P go ahead (its stall or its READ)
    reached: dict[str, float] = {}  # P's READ of the lease, or its gate's refusal
    for path in paths:
        for line in Path(path).read_text(encoding="ascii", errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line cut off by a killed worker
            ev, t = e.get("ev"), float(e.get("t", 0.0))
            if ev == "grant" and e.get("kind") == "turn":
                grants[str(e["req"])] = t
            elif ev == "release":
                releases[str(e["req"])] = (str(e["reason"]), float(e["at"]), float(e["granted_at"]))
            elif ev == "stall":
                admitted.setdefault(str(e["remote"]), t)
            elif ev == "read":
                lease = str(e.get("data", "")).rsplit(":", 1)[0]
                admitted.setdefault(lease, t)
                reached.setdefault(lease, t)
            elif ev == "recompute" and e.get("reason") == "gate":
                reached.setdefault(str(e.get("remote")), t)
    for lease, at_p in reached.items():
        if lease not in grants:
            continue  # a read of P's own blocks (D's trace) or of a lease not traced
        result.reached_s.append(at_p - grants[lease])
        reason, at, granted_at = releases.get(lease, ("live", 0.0, 0.0))
        if reason == "transferred" and at - granted_at > ttl:
            result.kept += 1
        elif reason == "expired" and (lease not in admitted or at < admitted[lease]):
            result.expired_waiting += 1
        elif reason == "expired":
            result.expired_stalled += 1
