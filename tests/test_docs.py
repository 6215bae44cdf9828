"""The documentation site builds with ``mkdocs build --strict`` (every link and
every API reference resolved), and the strict build does fail on a broken link."""

from __future__ import annotations

import os
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


def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "docs", root / "docs")
    for name in ("spec", "leaseproto", "proofs"):
        os.symlink(ROOT / name, root / name)
    with (root / "docs" / "metrics.md").open("a") as fh:
        fh.write("\nSee [nowhere](no-such-page.md).\n")
    r = _build(root, tmp_path / "site")
    assert r.returncode != 0
    assert "no-such-page.md" in r.stdout + r.stderr


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
