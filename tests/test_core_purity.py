"""The core owns no clock and does no I/O (spec §9): every module of the folder
``leaseproto/core/`` imports only the standard library (no time, threading,
asyncio, socket, torch or nixl, directly or by ``from ... import``) and
nothing of the package outside the folder; nothing in the package imports in a
cycle."""

import ast
from pathlib import Path

import leaseproto

FORBIDDEN = {
    "time",
    "threading",
    "asyncio",
    "socket",
    "torch",
    "nixl",
    "nixl_cu12",
    "multiprocessing",
    "subprocess",
    "selectors",
    "zmq",
}
ROOT = Path(leaseproto.__file__).parent
CORE = ROOT / "core"


def core_modules() -> list[Path]:
    return sorted(CORE.rglob("*.py"))


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
    assert {
        "table.py",
        "tracker.py",
        "rules.py",
        "state.py",
        "wire.py",
        "clock.py",
        "config.py",
        "sym.py",
        "events.py",
        "errors.py",
    } <= names


def test_core_imports_no_clock_and_no_io() -> None:
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN) for p in core_modules()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"core modules import clock/IO modules: {bad}"


def test_the_check_catches_an_offender(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from time import monotonic\nimport importlib\nimportlib.import_module('torch')\n")
    assert imported_roots(f) >= {"time", "torch"}


def test_importing_leaseproto_needs_no_third_party_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, leaseproto, leaseproto.wire, leaseproto.cli;"
        "bad = sorted(m for m in ('torch', 'z3', 'nixl', 'nixl_cu12', 'hypothesis', 'zmq',"
        " 'prometheus_client', 'numpy') if m in sys.modules);"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_time_dependent_methods_take_keyword_only_now() -> None:
    import inspect

    from leaseproto import HeartbeatTracker, LeaseTable

    for cls, names in (
        (LeaseTable, ("grant", "renew", "transfer_done", "abort", "expire")),
        (HeartbeatTracker, ("track", "due")),
    ):
        for name in names:
            param = inspect.signature(getattr(cls, name)).parameters["now"]
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, f"{cls.__name__}.{name}"


def _package_imports(path: Path) -> set[str]:
    """Modules of leaseproto that ``path`` imports, as dotted names (relative imports resolved)."""
    if path.parent == PROOFS:
        package = ["leaseproto", "proofs"]
    else:
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        package = parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "leaseproto":
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "leaseproto")
    return out


PROOFS = ROOT.parent / "proofs"  # installed as leaseproto.proofs


def _module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    for path in PROOFS.glob("*.py"):
        stem = "" if path.stem == "__init__" else f".{path.stem}"
        names[f"leaseproto.proofs{stem}"] = path
    return names


def _module_graph() -> dict[str, set[str]]:
    names = _module_names()
    graph = {}
    for name, path in names.items():
        graph[name] = {m for m in _package_imports(path) if m in names and m != name}
    return graph


def test_the_core_folder_imports_nothing_above_it() -> None:
    upward = {}
    for path in core_modules():
        up = sorted(
            m
            for m in _package_imports(path)
            if not (m == "leaseproto.core" or m.startswith("leaseproto.core."))
        )
        if up:
            upward[str(path.relative_to(ROOT))] = up
    assert not upward, f"core modules import the package above the core: {upward}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as a path that ends where it starts, or []."""
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str]:
        state[node] = 1
        for dep in sorted(graph[node]):
            if node.startswith(dep + ".") or dep.startswith(node + "."):
                continue  # a module and its own package's __init__ (re-exports)
            if state.get(dep) == 1:
                return [*stack, node, dep]
            if state.get(dep) is None:
                found = visit(dep, [*stack, node])
                if found:
                    return found
        state[node] = 2
        return []

    for node in sorted(graph):
        if state.get(node) is None:
            found = visit(node, [])
            if found:
                return found
    return []


def test_no_import_cycle_in_the_package() -> None:
    """Imports between the package's modules, lazy ones inside functions included,
    form no cycle."""
    cycle = _find_cycle(_module_graph())
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _find_cycle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == [
        "p.a",
        "p.b",
        "p.c",
        "p.a",
    ]
    assert _find_cycle({"p.a": {"p.b"}, "p.b": set()}) == []
    # the real graph is read: the table imports the rules, the scenarios the config
    graph = _module_graph()
    assert "leaseproto.core.rules" in graph["leaseproto.core.table"]
    assert "leaseproto.core.config" in graph["leaseproto.scenarios.format"]


#: The floors of the package (README "Layout"): a module imports only modules of lower floors
#: or of its own subpackage. A new subpackage must be given its floor here.
FLOORS = {
    "core": 0,
    "adapters": 1,  # the trace writer names the core's config and release records
    "toymodel": 2,  # its KV lives in the adapters' paged pool
    "scenarios": 2,
    "sim": 2,
    "integrations": 2,
    "workers": 3,  # they serve the toy model
    "checker": 4,  # it drives the workers' own verdict decisions (workers.verdicts)
    "harness": 4,  # it starts the workers and talks their request plane
    "testing": 5,  # its hypothesis machine drives the checker's naive model (floor 4)
    "proofs": 5,  # L15 runs the table against the checker's naive model (floor 4)
    "demo": 5,  # it runs the workers through the harness
    "cli": 6,
}


def _floor_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return ("", 7 if parts[1:] == ["__main__"] else 0)  # the public re-exports, the script
    sub = parts[1]
    assert sub in FLOORS, f"{module}: subpackage {sub!r} has no floor in FLOORS"
    return sub, FLOORS[sub]


def _floor_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in sorted(graph.items()):
        sub, floor = _floor_of(module)
        for dep in sorted(deps):
            dsub, dfloor = _floor_of(dep)
            if dsub == "" and dfloor == 0 and sub != "core":
                continue  # the public names of `leaseproto` are the core's
            if sub == "" and dsub == "core":
                continue  # ... re-exported from it
            if dsub != sub and dfloor >= floor:
                bad.append(f"{module} (floor {floor}) imports {dep} (floor {dfloor})")
    return bad


def test_every_import_goes_down_a_floor_or_stays_in_its_subpackage() -> None:
    bad = _floor_violations(_module_graph())
    assert not bad, "\n".join(bad)


def test_the_floor_check_sees_an_upward_import() -> None:
    graph = {
        "leaseproto.core.table": {"leaseproto.workers.prefill"},
        "leaseproto.workers.prefill": {"leaseproto.harness.cluster", "leaseproto.core.table"},
        "leaseproto.sim.fleet": {"leaseproto", "leaseproto.scenarios.format"},
    }
    assert _floor_violations(graph) == [
        "leaseproto.core.table (floor 0) imports leaseproto.workers.prefill (floor 3)",
        "leaseproto.sim.fleet (floor 2) imports leaseproto.scenarios.format (floor 2)",
        "leaseproto.workers.prefill (floor 3) imports leaseproto.harness.cluster (floor 4)",
    ]
