"""Mutation run over the core: which mutants do the tests, the checker and the proofs kill?

    python tools/mutation_run.py --jobs 8 --sample 0.5 --seed 0

Each mutant changes one node of one core module (comparison, arithmetic,
``max``/``min`` and ``vmax``/``vmin``, boolean, constant, return value,
statement deletion). It is written into a private copy of the package, and
three layers run against it, each in its own process with a timeout:

* ``tests``: the fast unit tests of the core (no e2e, no hypothesis machines);
* ``checker``: ``leaseproto check`` on the small scopes;
* ``proofs``: ``leaseproto prove`` (rules and state table only: the other
  modules are not in any z3 model).

A mutant is killed by a layer when that layer fails (or times out). The report
lists every survivor with its location, for a human to classify as equivalent
or as a gap.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "leaseproto" / "core"
MODULES = ["rules.py", "state.py", "table.py", "tracker.py", "wire.py", "config.py", "clock.py"]
SAMPLED = {"table.py", "wire.py", "config.py"}
UNIT_TESTS = [
    "tests/test_table.py",
    "tests/test_tracker.py",
    "tests/test_wire.py",
    "tests/test_config.py",
    "tests/test_clock.py",
    "tests/test_state_table.py",
    "tests/test_rules_agree.py",
    "tests/test_verdicts.py",
]
SWAP_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv}
SWAP_NAME = {
    "max": "min",
    "min": "max",
    "vmax": "vmin",
    "vmin": "vmax",
    "conj": "disj",
    "disj": "conj",
}


@dataclass(frozen=True)
class Mutant:
    module: str
    index: int
    line: int
    what: str


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    out: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in SWAP_CMP:
            out.append(
                (node, f"{type(node.ops[0]).__name__} -> {SWAP_CMP[type(node.ops[0])].__name__}")
            )
        elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
            out.append((node, f"{type(node.op).__name__} -> {SWAP_BIN[type(node.op)].__name__}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in SWAP_NAME
        ):
            out.append((node, f"{node.func.id} -> {SWAP_NAME[node.func.id]}"))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "and <-> or"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool) and node.lineno > 0:
            out.append((node, f"constant {node.value!r} changed"))
        elif isinstance(node, ast.Return) and node.value is not None:
            out.append((node, "return None"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and not (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        ):
            out.append((node, "statement deleted"))
    return out


def _apply(node: ast.AST, what: str) -> None:
    if isinstance(node, ast.Compare):
        node.ops[0] = SWAP_CMP[type(node.ops[0])]()
    elif isinstance(node, ast.BinOp):
        node.op = SWAP_BIN[type(node.op)]()
    elif isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        node.func.id = SWAP_NAME[node.func.id]
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.Constant):
        node.value = (not node.value) if isinstance(node.value, bool) else node.value + 1
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)
    else:  # statement deletion: replace by `pass` in place
        node.__class__ = ast.Pass
        for f in list(node._fields):
            if hasattr(node, f):
                delattr(node, f)


def mutants(sample: float, seed: int) -> list[Mutant]:
    rnd = random.Random(seed)
    out = []
    for mod in MODULES:
        tree = ast.parse((CORE / mod).read_text())
        for i, (node, what) in enumerate(_sites(tree)):
            if mod in SAMPLED and rnd.random() >= sample:
                continue
            out.append(Mutant(mod, i, getattr(node, "lineno", 0), what))
    return out


def mutated_source(m: Mutant) -> str:
    tree = ast.parse((CORE / m.module).read_text())
    node, what = _sites(tree)[m.index]
    _apply(node, what)
    return ast.unparse(ast.fix_missing_locations(tree))


def _layers(m: Mutant) -> dict[str, list[str]]:
    py = sys.executable
    out = {
        "tests": [
            py,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            *UNIT_TESTS,
        ],
        "checker": [
            py,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_checker.py",
            "-k",
            "small_scope or hold_on_the_real_code",
        ],
    }
    if m.module in ("rules.py", "state.py", "sym.py"):
        out["proofs"] = [py, "-m", "leaseproto.proofs"]
    return out


def run_one(m: Mutant, timeout: float) -> tuple[Mutant, dict[str, bool]]:
    with tempfile.TemporaryDirectory(prefix="mut-") as tmp:
        work = Path(tmp)
        shutil.copytree(ROOT / "leaseproto", work / "leaseproto")
        shutil.copytree(ROOT / "proofs", work / "leaseproto" / "proofs", dirs_exist_ok=True)
        shutil.copytree(ROOT / "tests", work / "tests")
        (work / "leaseproto" / "core" / m.module).write_text(mutated_source(m))
        env = {**os.environ, "PYTHONPATH": str(work), "HYPOTHESIS_PROFILE": "ci"}
        killed = {}
        for layer, cmd in _layers(m).items():
            try:
                r = subprocess.run(
                    cmd, cwd=work, env=env, capture_output=True, timeout=timeout, check=False
                )
                killed[layer] = r.returncode != 0
            except subprocess.TimeoutExpired:
                killed[layer] = True
        return m, killed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument(
        "--sample", type=float, default=0.5, help="share of table/wire/config mutants run"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per layer and mutant")
    ap.add_argument("--limit", type=int, default=None, help="run only the first N mutants")
    ap.add_argument("--module", action="append", help="only these core modules")
    args = ap.parse_args(argv)
    ms = mutants(args.sample, args.seed)
    if args.module:
        ms = [m for m in ms if m.module in args.module]
    ms = ms[: args.limit] if args.limit else ms
    results: list[tuple[Mutant, dict[str, bool]]] = []
    with cf.ProcessPoolExecutor(args.jobs) as pool:
        for m, killed in pool.map(run_one, ms, [args.timeout] * len(ms)):
            results.append((m, killed))
            tag = ",".join(k for k, v in killed.items() if v) or "SURVIVED"
            print(f"{m.module}:{m.line} {m.what}: {tag}", flush=True)
    n = len(results)
    any_kill = sum(any(k.values()) for _, k in results)
    formal = sum(k.get("checker", False) or k.get("proofs", False) for _, k in results)
    tests = sum(k["tests"] for _, k in results)
    print(
        f"\n{n} mutants: {any_kill} killed ({100 * any_kill / max(n, 1):.1f}%); "
        f"unit tests alone {tests}; checker + proofs alone {formal}"
    )
    print("survivors:")
    for m, k in results:
        if not any(k.values()):
            print(f"  {m.module}:{m.line} {m.what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
