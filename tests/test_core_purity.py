"""The core owns no clock and does no I/O (spec §9): no module of leaseproto
outside the adapter-side subpackages imports time, threading, asyncio, socket,
torch or nixl, directly or by ``from ... import``."""

import ast
from pathlib import Path

import leaseproto

FORBIDDEN = {"time", "threading", "asyncio", "socket", "torch", "nixl", "nixl_cu12",
             "multiprocessing", "subprocess", "selectors", "zmq"}
#: Subpackages that talk to the outside world; everything else is core.
NON_CORE = {"adapters", "workers", "cli", "sim"}
ROOT = Path(leaseproto.__file__).parent


def core_modules() -> list[Path]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in NON_CORE:
            continue
        out.append(path)
    return out


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    roots.add(arg.value.split(".")[0])
    return roots


def test_core_modules_exist() -> None:
    names = {p.name for p in core_modules()}
    assert {"_table.py", "_tracker.py", "_rules.py", "wire.py", "_clock.py"} <= names


def test_core_imports_no_clock_and_no_io() -> None:
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN)
           for p in core_modules()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"core modules import clock/IO modules: {bad}"


def test_the_check_catches_an_offender(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from time import monotonic\nimport importlib\nimportlib.import_module('torch')\n")
    assert imported_roots(f) >= {"time", "torch"}


def test_importing_leaseproto_needs_no_third_party_package() -> None:
    import subprocess
    import sys
    code = ("import sys, leaseproto, leaseproto.wire, leaseproto.cli;"
            "bad = sorted(m for m in ('torch', 'z3', 'nixl', 'nixl_cu12', 'hypothesis', 'zmq',"
            " 'prometheus_client', 'numpy') if m in sys.modules);"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_time_dependent_methods_take_keyword_only_now() -> None:
    import inspect

    from leaseproto import HeartbeatTracker, LeaseTable
    for cls, names in ((LeaseTable, ("grant", "renew", "transfer_done", "abort", "expire")),
                       (HeartbeatTracker, ("track", "due"))):
        for name in names:
            param = inspect.signature(getattr(cls, name)).parameters["now"]
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, f"{cls.__name__}.{name}"
