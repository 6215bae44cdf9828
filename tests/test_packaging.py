"""The distribution: what `pip install .` puts on disk and what it reports.

Builds the wheel once (setuptools from this environment, no network) and
checks it the way a user's install would see it: a single top-level package,
the proofs under ``leaseproto.proofs``, the spec's example scenarios inside,
the licence in the metadata, and the version written once."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

import leaseproto

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (path,) = out.glob("leaseproto-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def _run_installed(site: Path, *args: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    """``python -S ...`` with only the installed wheel (and ``extra``) on the path, from a
    folder that is not the checkout: neither this environment's site-packages nor the
    editable install of the checkout is visible."""
    path = f"{site}:{extra}" if extra else str(site)
    env = {"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-S", *args],
        cwd=site.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_package_of_the_tree_is_listed() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    tree = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "leaseproto").rglob("__init__.py")
    }
    tree |= {name for name in mapped if name != ""}
    assert listed == tree


def test_the_wheel_installs_no_top_level_module_but_leaseproto(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = f"leaseproto-{leaseproto.__version__}.dist-info"
    assert tops == {"leaseproto", dist_info}
    assert "leaseproto/proofs/check.py" in names
    assert "leaseproto/scenarios/bundled/d-crash.jsonl" in names
    assert "leaseproto/py.typed" in names
    assert any(n.startswith(f"{dist_info}/") and n.endswith("LICENSE") for n in names)


def test_the_version_is_written_once() -> None:
    version = PYPROJECT["project"]["version"]
    assert leaseproto.__version__ == version
    for path in (ROOT / "leaseproto").rglob("*.py"):
        assert f'"{version}"' not in path.read_text(), f"{path} repeats the version"
    r = subprocess.run(
        [sys.executable, "-m", "leaseproto", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"leaseproto {leaseproto.__version__}"


def test_the_installed_wheel_replays_its_bundled_examples(installed: Path) -> None:
    r = _run_installed(installed, "-m", "leaseproto", "replay", "--list")
    assert r.returncode == 0, r.stderr
    assert "d-crash" in r.stdout.split()
    r = _run_installed(installed, "-m", "leaseproto", "replay", "d-crash")
    assert r.returncode == 0, r.stderr
    assert "expects: 5 ok, 0 failed" in r.stdout


def test_the_installed_wheel_runs_its_proofs(installed: Path) -> None:
    z3 = pytest.importorskip("z3")
    z3_site = str(Path(z3.__file__).parent.parent)
    r = _run_installed(installed, "-m", "leaseproto.proofs", "--only", "I1", extra=z3_site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all ok" in r.stdout
    r = _run_installed(installed, "-m", "leaseproto", "prove", "--only", "I1", extra=z3_site)
    assert r.returncode == 0 and "all ok" in r.stdout, r.stdout + r.stderr
    where = _run_installed(
        installed,
        "-c",
        "import leaseproto.proofs as p, leaseproto as l; print(p.__file__, l.__file__)",
    )
    assert all(f.startswith(str(installed)) for f in where.stdout.split()), where.stdout
