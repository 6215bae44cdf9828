"""ruff and mypy --strict are part of the suite, and the README's example runs."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> list[str]:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return [exe]


def _pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data


def test_ruff_format_clean() -> None:
    # the whole tree, as a contributor runs it (Markdown is excluded in pyproject.toml)
    r = subprocess.run(
        [*_tool("ruff"), "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_clean() -> None:
    r = subprocess.run(
        [*_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_is_the_pinned_version() -> None:
    """Formatting changes between ruff releases: the one checked with is the test extra's."""
    pins = [d for d in _pyproject()["project"]["optional-dependencies"]["test"] if "ruff" in d]
    assert len(pins) == 1 and pins[0].startswith("ruff=="), pins
    r = subprocess.run([*_tool("ruff"), "--version"], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["ruff", pins[0].removeprefix("ruff==")], (r.stdout, pins)


def test_mypy_strict_clean() -> None:
    # plain `mypy`, as the pre-commit hook runs it: [tool.mypy] packages say what it checks
    r = subprocess.run([*_tool("mypy")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    checked = int(re.search(r"in (\d+) source files", r.stdout)[1])  # type: ignore[index]
    assert checked > len(list((ROOT / "leaseproto").rglob("*.py"))), r.stdout


#: benchmarks/ holds scripts, run as ``python benchmarks/x.py``, that import their siblings as
#: top-level modules (``from _common import ...``). Given the folder (it has no __init__.py),
#: mypy maps each file to a top-level module and puts the file's folder on its search path, as
#: Python puts the script's: a second run, since [tool.mypy] packages and files on the command
#: line do not mix (the files replace the packages). The pre-commit hook runs the same.
MYPY_BENCHMARKS_ARGS = ["benchmarks"]


def test_mypy_strict_clean_benchmarks() -> None:
    r = subprocess.run(
        [*_tool("mypy"), *MYPY_BENCHMARKS_ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    checked = int(re.search(r"in (\d+) source files", r.stdout)[1])  # type: ignore[index]
    assert checked == len(list((ROOT / "benchmarks").rglob("*.py"))), r.stdout


def _hooks() -> dict[str, dict[str, Any]]:
    yaml = pytest.importorskip("yaml")  # comes with pre-commit
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    ids = [h["id"] for h in hooks]
    assert len(ids) == len(set(ids)), ids
    return dict(zip(ids, hooks, strict=True))


def _filtered_to(hook: dict[str, Any]) -> list[str]:
    folders = re.fullmatch(r"\^\((.*)\)/", hook["files"])
    assert folders is not None, hook["files"]
    return sorted(folders[1].split("|"))


def test_mypy_hook_reaches_every_folder_it_is_filtered_to() -> None:
    """The pre-commit hook runs on changes under its ``files`` folders and runs
    plain ``mypy``: each folder must be one [tool.mypy] checks (proofs/ was not)."""
    hook = _hooks()["mypy"]
    assert hook["entry"] == "mypy" and hook["pass_filenames"] is False
    assert _filtered_to(hook) == sorted(_pyproject()["tool"]["mypy"]["packages"])


def test_mypy_benchmarks_hook_runs_on_what_the_benchmarks_read() -> None:
    """The benchmarks' hook runs the test's command, on changes to benchmarks/ and to
    the project's packages the scripts import (mypy follows them: a change there can
    break a script), and no other folder."""
    hook = _hooks()["mypy-benchmarks"]
    assert hook["entry"].split() == ["mypy", *MYPY_BENCHMARKS_ARGS], hook["entry"]
    assert hook["pass_filenames"] is False
    imported: set[str] = set()
    for path in (ROOT / "benchmarks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    ours = sorted(n for n in imported if (ROOT / n / "__init__.py").is_file())
    assert "leaseproto" in ours, ours
    assert _filtered_to(hook) == sorted(["benchmarks", *ours])


def test_readme_library_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has a python example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_python_dash_m_leaseproto() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "leaseproto", "config", "--kv-lease-duration", "12"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and "lease_extension" in r.stdout
