"""The documentation site builds with ``mkdocs build --strict`` (every link and
every API reference resolved), and the strict build does fail on a broken link."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent


def _build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_docs_build_strict(tmp_path: Path) -> None:
    r = _build(ROOT, tmp_path / "site")
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path / "site"
    # the generated pages are there: README sections, the spec, the API reference
    assert (site / "guide" / "running-workers" / "index.html").exists()
    assert "I13" in (site / "spec" / "index.html").read_text()
    api = (site / "api" / "core" / "index.html").read_text()
    assert "LeaseTable" in api and "transfer_done" in api
    # the connector classes, which the vLLM package only loads on first access
    vllm = (site / "api" / "vllm" / "index.html").read_text()
    for name in (
        "LeaseprotoConnector",
        "LeaseprotoConnectorScheduler",
        "LeaseprotoConnectorWorker",
    ):
        assert re.search(rf'id="leaseproto\.integrations\.vllm\.\w+\.{name}"', vllm), name


@pytest.mark.parametrize("link", ["no-such-page.md", "#no-such-heading", "vllm.md#no-such"])
def test_strict_build_fails_on_a_broken_link(link: str, tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs")
    for name in ("spec", "leaseproto", "proofs", "benchmarks"):
        os.symlink(ROOT / name, root / name)
    with (root / "docs" / "metrics.md").open("a") as fh:
        fh.write(f"\nSee [nowhere]({link}).\n")
    r = _build(root, tmp_path / "site")
    assert r.returncode != 0
    assert link in r.stdout + r.stderr


def test_pre_commit_config_runs_ruff_lint_format_and_mypy() -> None:
    pytest.importorskip("pre_commit")
    import yaml  # pre-commit's own dependency

    path = ROOT / ".pre-commit-config.yaml"
    r = subprocess.run(
        [sys.executable, "-m", "pre_commit", "validate-config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    hooks = {
        h["id"]: h for repo in yaml.safe_load(path.read_text())["repos"] for h in repo["hooks"]
    }
    assert hooks["ruff-check"]["entry"].startswith("ruff check")
    assert hooks["ruff-format"]["entry"].startswith("ruff format")
    assert hooks["mypy"]["entry"] == "mypy" and hooks["mypy"]["pass_filenames"] is False


_BENCH = re.compile(r"python benchmarks/(\w+)\.py")
_RULE = re.compile(r"\|[-:| ]+\|$")


def _benchmark_tables(page: Path) -> list[tuple[int, list[str], list[str]]]:
    """Each table of ``page`` below a command block that runs benchmarks: (line, the
    scripts the section's latest such block runs, the table's header cells). Tables of
    a ``## `` section before any such block (summaries, not a script's output) are left out."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, list[str], list[str]]] = []
    scripts: list[str] = []
    fenced = fresh = False  # fresh: in a fence that has named no benchmark yet
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = fresh = not fenced
        elif not fenced and line.startswith("## "):
            scripts = []
        elif fenced and _BENCH.search(line):
            scripts = [*([] if fresh else scripts), *_BENCH.findall(line)]
            fresh = False
        elif scripts and line.startswith("|") and i + 1 < len(lines) and _RULE.match(lines[i + 1]):
            found.append((i + 1, scripts, [c.strip() for c in line.strip().strip("|").split("|")]))
    return found


_HELPER = re.compile(r"^from (_\w+) import", re.MULTILINE)


def _script_source(script: str) -> str:
    """A benchmark's source with that of the ``benchmarks/_*.py`` helpers it imports
    (where some of the tables it prints are built)."""
    bench = ROOT / "benchmarks"
    src = (bench / f"{script}.py").read_text("utf-8")
    helpers = [bench / f"{m}.py" for m in _HELPER.findall(src)]
    return "\n".join([src, *(h.read_text("utf-8") for h in helpers if h.exists())])


@pytest.mark.parametrize("name", ["performance.md", "vllm.md"])
def test_benchmark_tables_have_the_columns_their_benchmark_prints(name: str) -> None:
    """A table shown as a benchmark's output names only columns that benchmark prints
    (a selection of them may be shown), and the command that regenerates it exists."""
    tables = _benchmark_tables(ROOT / "docs" / name)
    assert tables, f"docs/{name} shows no benchmark's table"
    for line, scripts, header in tables:
        sources = {s: _script_source(s) for s in scripts}
        missing = {s: [c for c in header if c not in src] for s, src in sources.items()}
        assert any(not m for m in missing.values()), f"docs/{name}:{line}: {missing}"
