"""ruff and mypy --strict are part of the suite, and the README's example runs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> list[str]:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return [exe]


TARGETS = [p for p in ("leaseproto", "proofs", "tests", "benchmarks") if (ROOT / p).exists()]


def test_ruff_format_clean() -> None:
    r = subprocess.run(
        [*_tool("ruff"), "format", "--check", *TARGETS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_clean() -> None:
    r = subprocess.run(
        [*_tool("ruff"), "check", *TARGETS], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_clean() -> None:
    r = subprocess.run([*_tool("mypy")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


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
