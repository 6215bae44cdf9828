"""Mutation run over the core: which mutants do the unit tests, the model checker
and the proofs kill, each on its own?

    nice -n 10 python tools/mutation_run.py --jobs 2 --out mutation.jsonl
    python tools/mutation_run.py --report mutation.jsonl      # the figures again (also .jsonl.gz)

The mutants are those of tools/mutants.py (every core module; table, wire,
wire_ids and config sampled at ``--sample``). Three layers judge each
one, each in a process of its own forked from this one (pytest, hypothesis and
z3 already imported; the mutated module is served from memory by an import hook,
so nothing is copied and nothing on disk changes; tools/mutation_layers.py):

* ``tests``: the hand-written tests of the core (``TEST_FILES``: unit tests, the
  hypothesis machines in the derandomised ``ci`` profile, the scenario replays);
* ``checker``: the model checker on the real code, scopes ``QUICK`` of
  :mod:`leaseproto.checker.scope` (``small`` exhaustive, the others bounded);
* ``proofs``: ``leaseproto prove`` (every obligation); by default only on the
  mutants the checker did not kill by a violated invariant (``--every-layer``: on
  all), since the figure asked for is what the checker and the proofs kill together.

Each kill records its ``kind`` (``mutation_layers.KINDS``): wrong behaviour (a
violated invariant, a failed obligation or test), misuse, crash or timeout; the
report counts them apart, and gives the checker-and-proofs figure by behaviour.

A layer kills a mutant when it fails, errs or one of its units runs past its
limit (``mutation_layers.unit_limit``: a multiple of the unit's baseline time). First a
baseline runs each layer on the unmutated code under a line tracer and records
which core lines each test, scope and the proofs execute; a layer then runs a
mutant only with the tests (scopes) that execute one of its lines, and a mutant
none of them executes is *not reached* by that layer: its run would be the
baseline's, which passes. Runs are deterministic (``PYTHONHASHSEED=0``,
derandomised hypothesis), which is what makes that skipping exact.
Survivors are classified by hand in tools/mutation_notes.py (equivalent, with
the reason; anything else counts against the figure).
"""

# ruff: noqa: PLC0415  (pytest, hypothesis and z3 imported once in run(), before the forks)
from __future__ import annotations

import argparse
import collections
import ctypes
import gzip
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import ROOT, Mutant, mutants
from mutation_layers import KINDS, LAYERS, baseline_child, child, kind_of

#: a task source yields this when it has nothing to start until a running task ends
WAIT = ("wait",)
#: the core's data structures, whose mutants ``prove`` is to kill by a failed obligation
DATA_MODULES = ("table.py", "deadlines.py", "renewal.py", "tracker.py")


def _fork(fn: Any, args: tuple[Any, ...], timeout: float, log: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: quiet, bounded, gone with its parent, never returns
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        signal.alarm(int(timeout))
        fn(*args)
    finally:
        os._exit(0)


def _jobs_loop(
    tasks: Iterator[tuple[Any, ...]], jobs: int, timeout: float, tmp: Path
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Runs ``(tag, fn, args_without_out)`` tasks ``jobs`` at a time; yields (tag, result)."""
    running: dict[int, tuple[Any, Path, float]] = {}
    n = 0
    for_more = True
    while for_more or running:
        while for_more and len(running) < jobs:
            task = next(tasks, None)
            if task is None:
                for_more = False
                break
            if task is WAIT:
                break
            tag, fn, args = task
            n += 1
            out = tmp / f"r{n}.json"
            out.unlink(missing_ok=True)
            pid = _fork(fn, (*args, out), timeout, tmp / f"r{n}.log")
            running[pid] = (tag, out, time.perf_counter())
        if not running:
            break
        pid, status = os.wait()
        tag, out, start = running.pop(pid)
        if out.exists() and out.stat().st_size:
            res = json.loads(out.read_text())
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
            res = {"killed": True, "kind": "timeout", "first": f"timeout ({timeout:.0f} s)"}
        else:
            res = {"killed": True, "kind": "crash", "first": f"child died (status {status})"}
        res["seconds"] = round(time.perf_counter() - start, 2)
        yield tag, res


def _select(m: Mutant, base: dict[str, Any], layer: str) -> list[str] | None:
    """The units of ``layer`` that execute one of ``m``'s lines, fastest first;
    None: all of them (a node run at import: every unit runs it; or no baseline)."""
    if base[layer] is None:
        return None
    if not m.in_body:
        if layer != "tests":
            return None
        want = None
    else:
        want = {f"{m.module}:{n}" for n in range(m.line, m.end_line + 1)}
    cov, took = base[layer]["cov"], base[layer]["took"]
    if want is None:  # every test, also those that run no core line (they read attributes)
        units = sorted(set(took) | (set(cov) - {"<import>"}))
    else:
        units = [u for u, lines in cov.items() if u != "<import>" and want & lines]
    return units if layer == "checker" else sorted(units, key=lambda u: took.get(u, 0.0))


def _fingerprint() -> str:
    """What the baseline depends on: the sources of the package, proofs and tests."""
    h = hashlib.sha1()
    for d in ("leaseproto", "proofs", "tests"):
        for p in sorted((ROOT / d).rglob("*.py")):
            h.update(p.read_bytes())
    return h.hexdigest()


def _share(key: str) -> float:
    return int(hashlib.sha1(("rate:" + key).encode()).hexdigest()[:8], 16) / 2**32


def run(args: argparse.Namespace) -> int:
    import hypothesis  # noqa: F401  (imported once, before the forks)
    import pytest  # noqa: F401
    import z3  # noqa: F401

    os.environ["PYTHONHASHSEED"] = "0"  # for any process a layer starts
    os.environ["HYPOTHESIS_PROFILE"] = "ci"
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    done = set()
    if args.resume and out.exists():
        done = {json.loads(line)["key"] for line in out.read_text().splitlines() if line}
    t0 = time.perf_counter()
    base: dict[str, Any] = {la: None for la in LAYERS} if args.full else {}
    cache = Path(args.tmp) / f"baseline-{_fingerprint()}.json"
    if not args.full and cache.exists():
        base = json.loads(cache.read_text())
    wanted = [la for la in LAYERS if la in (args.layers or LAYERS)]
    base_tasks = iter([(la, baseline_child, (la,)) for la in wanted if la not in base])
    for layer, res in _jobs_loop(base_tasks, args.jobs, 3600, tmp):
        if res.get("failed") or "cov" not in res:
            print(f"baseline: layer {layer} fails on the unmutated code: {res}", file=sys.stderr)
            return 2
        base[layer] = {"cov": res["cov"], "took": res.get("took", {})}
        print(f"baseline {layer}: {len(res['cov'])} units, {res['seconds']} s", flush=True)
    if not args.full:
        cache.write_text(json.dumps(base))
        for layer in base:
            base[layer]["cov"] = {u: set(v) for u, v in base[layer]["cov"].items()}
    ms = [m for m in mutants(args.sample) if m.key not in done]
    if args.rate < 1.0:  # a stable share of every module, modules interleaved
        ms = [m for m in ms if _share(m.key) < args.rate]
    ms.sort(key=lambda m: _share(m.key + "/order"))
    if args.module:
        ms = [m for m in ms if m.module in args.module]
    if args.only:
        keys = set(Path(args.only).read_text().split("\n"))
        ms = [m for m in ms if m.key in keys]
    ms = ms[: args.limit] if args.limit else ms
    print(f"{len(ms)} mutants to run", flush=True)
    results: dict[str, dict[str, Any]] = {m.key: {} for m in ms}
    by_key = {m.key: m for m in ms}

    layers = wanted

    ready: collections.deque[tuple[Any, ...]] = collections.deque()
    waiting: set[str] = set()  # the checker's verdict decides whether the proofs run

    def task(m: Mutant, layer: str) -> tuple[Any, ...] | None:
        units = _select(m, base, layer)
        if units == []:
            results[m.key][layer] = {"killed": False, "reached": False}
            return None
        took = base[layer]["took"] if base.get(layer) else {}
        return (m.key, layer), child, (m, layer, units, took, args.timeout)

    def proofs_after_checker(m: Mutant) -> tuple[Any, ...] | None:
        """The proofs' task, unless the checker (whose verdict is in) killed ``m`` by
        wrong behaviour (a crash or misuse kill still runs the proofs: the figure
        counts kills by behaviour apart)."""
        if kind_of("checker", results[m.key]["checker"]) == "behaviour":
            results[m.key]["proofs"] = {"killed": False, "skipped": True}
            return None
        return task(m, "proofs")

    def tasks() -> Iterator[tuple[Any, ...]]:
        for m in ms:
            while ready:
                yield ready.popleft()
            for layer in layers:
                if layer == "proofs" and "checker" in layers and not args.every_layer:
                    if "checker" not in results[m.key]:
                        waiting.add(m.key)  # queued when the checker's verdict comes
                        continue
                    t = proofs_after_checker(m)
                else:
                    t = task(m, layer)
                if t is not None:
                    yield t
        while ready or waiting:
            yield ready.popleft() if ready else WAIT

    def finished(key: str) -> None:
        m = by_key[key]
        row = {"key": key, "where": m.where(), "what": m.what, **results.pop(key)}
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        tag = ",".join(k for k in layers if row[k]["killed"]) or "SURVIVED"
        print(f"{m.where()} {m.what}: {tag}", flush=True)

    with out.open("a") as fh:
        # the wall-clock backstop (the layers' own limits are CPU time): a load of 2
        # other processes a core still leaves a unit its whole CPU limit
        for (key, layer), res in _jobs_loop(tasks(), args.jobs, 3 * args.timeout + 30, tmp):
            results[key][layer] = {**res, "reached": True}
            if layer == "checker" and key in waiting:
                waiting.discard(key)
                t = proofs_after_checker(by_key[key])
                if t is not None:
                    ready.append(t)
            if len(results[key]) == len(layers):
                finished(key)
        for key in [k for k, res in results.items() if len(res) == len(layers)]:
            finished(key)  # every layer settled without a run (not reached, skipped)
    print(f"run time {time.perf_counter() - t0:.0f} s", flush=True)
    report(out)
    return 0


def report(path: Path, markdown: bool = False) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mutation_notes import EQUIVALENT

    rows = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        if line:
            row = json.loads(line)
            rows[row["key"]] = {**rows.get(row["key"], {}), **row}  # a rerun replaces its layers
    live = set(mutants(1.0))
    current = {m.key for m in live}
    # a layer a row lacks (a rerun with --layers, alone in its file) did not run: not killed
    not_run: dict[str, Any] = {la: {"killed": False} for la in LAYERS}
    rows = {k: {**not_run, **r} for k, r in rows.items() if k in current}
    killed = {k for k, r in rows.items() if any(r[la]["killed"] for la in LAYERS)}
    equiv = {k for k in rows if k not in killed and k in EQUIVALENT}
    non_eq = len(rows) - len(equiv)
    formal = {k for k in killed if rows[k]["checker"]["killed"] or rows[k]["proofs"]["killed"]}
    behaviour = {
        k
        for k in formal
        if "behaviour" in (kind_of(la, rows[k][la]) for la in ("checker", "proofs"))
    }
    tests = {k for k in killed if rows[k]["tests"]["killed"]}
    only_formal = formal - tests
    pct = lambda a, b: f"{100 * a / max(b, 1):.1f}%"  # noqa: E731
    print(f"{len(rows)} mutants; {len(equiv)} equivalent; {non_eq} non-equivalent")
    share = pct(len(killed), non_eq)
    print(f"killed by tests + checker + proofs: {len(killed)} of {non_eq} ({share})")
    print(f"  unit tests alone: {len(tests)} ({pct(len(tests), non_eq)})")
    print(f"  checker + proofs alone: {len(formal)} ({pct(len(formal), non_eq)})")
    print(
        f"  checker + proofs alone by wrong behaviour (a violated invariant or a failed "
        f"obligation): {len(behaviour)} ({pct(len(behaviour), non_eq)})"
    )
    for la in LAYERS:
        n = sum(rows[k][la]["killed"] for k in rows)
        skipped = sum(bool(rows[k][la].get("skipped")) for k in rows)
        after = f"; not run on the {skipped} the checker killed" if skipped else ""
        kinds = collections.Counter(kind_of(la, rows[k][la]) for k in rows)
        split = ", ".join(f"{kinds[kd]} {kd}" for kd in KINDS)
        print(f"    {la}: {n} ({pct(n, non_eq)}{after}): {split}")
    print(f"  killed by checker or proofs and by no unit test: {len(only_formal)}")
    # per module: how many each layer killed by wrong behaviour (issue 20's item 1 asks
    # it of the proofs on the data-structure modules, DATA_MODULES)
    per_mod: dict[str, collections.Counter[str]] = {}
    for k, r in rows.items():
        c = per_mod.setdefault(k.split(":")[0], collections.Counter())
        c["run"] += 1
        c["killed"] += k in killed
        c["equivalent"] += k in equiv
        for la in LAYERS:
            c[la] += kind_of(la, r[la]) == "behaviour"
    for mod, c in sorted(per_mod.items()):
        by = ", ".join(f"{la} {c[la]}" for la in LAYERS)
        print(
            f"    {mod}: {c['run']} run, {c['killed']} killed, {c['equivalent']} equivalent;"
            f" by wrong behaviour: {by}"
        )
    data = [per_mod[m] for m in DATA_MODULES if m in per_mod]
    n_data = sum(c["run"] - c["equivalent"] for c in data)
    by_proofs = sum(c["proofs"] for c in data)
    print(
        f"  proofs alone by a failed obligation on {', '.join(DATA_MODULES)}: "
        f"{by_proofs} of {n_data} non-equivalent ({pct(by_proofs, n_data)})"
    )
    print(
        "\n| mutant | change | reached by | verdict |\n|---|---|---|---|"
        if markdown
        else "survivors:"
    )
    for k in sorted(set(rows) - killed):
        r, note = rows[k], EQUIVALENT.get(k)
        reached = ", ".join(la for la in LAYERS if r[la].get("reached")) or "none"
        verdict = f"equivalent: {note}" if note else "NOT KILLED"
        if markdown:
            print(f"| `{r['where']}` | {r['what']} | {reached} | {verdict} |")
        else:
            print(f"  {r['where']} {r['what']} [reached by {reached}] {verdict}\n    {k}")


def _deterministic() -> None:
    """Runs again under ``PYTHONHASHSEED=0`` unless already: the forked layers inherit
    this process's hash seed, and set and dict orders (hence the terms z3 is given, and
    its time on them) must be the same in the baseline and in every mutant's run."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--sample", type=float, default=0.5, help="share of the sampled modules run")
    ap.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds per layer and mutant (each unit has its own, smaller limit)",
    )
    ap.add_argument("--rate", type=float, default=1.0, help="run this stable share of all mutants")
    ap.add_argument("--limit", type=int, default=None, help="run only the first N mutants")
    ap.add_argument("--module", action="append", help="only these core modules")
    ap.add_argument("--only", help="a file of mutant keys, one a line: run only those")
    ap.add_argument("--out", default="mutation.jsonl", help="results, one JSON line a mutant")
    ap.add_argument("--resume", action="store_true", help="skip mutants already in --out")
    ap.add_argument("--layers", nargs="+", choices=LAYERS, help="run only these layers")
    ap.add_argument("--tmp", default="/tmp/leaseproto-mutation")
    ap.add_argument(
        "--full", action="store_true", help="no baseline: every test and scope for each mutant"
    )
    ap.add_argument(
        "--every-layer",
        action="store_true",
        help="run the proofs on mutants the checker killed too (default: skip those it "
        "killed by a violated invariant)",
    )
    ap.add_argument("--report", metavar="JSONL", help="only print the figures of a run")
    ap.add_argument("--markdown", action="store_true", help="--report's survivors as a table")
    args = ap.parse_args(argv)
    if args.report:
        report(Path(args.report), markdown=args.markdown)
        return 0
    if argv is None:
        _deterministic()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
