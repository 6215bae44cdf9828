"""The example scenarios of ``spec/scenarios/``, wherever the package is installed.

The wheel carries them as the data package ``leaseproto.scenarios.bundled``
(``pyproject.toml`` maps it to ``spec/scenarios``), so ``leaseproto replay
d-crash`` works from a wheel as well as from a checkout.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["example_path", "example_paths"]

_PACKAGE = f"{__package__}.bundled"
_SUFFIX = ".jsonl"


def example_paths() -> list[Path]:
    """Every bundled scenario, sorted by name."""
    try:
        entries = [Path(str(entry)) for entry in resources.files(_PACKAGE).iterdir()]
    except ModuleNotFoundError:  # a source tree on sys.path that was never installed
        entries = list((Path(__file__).resolve().parents[2] / "spec" / "scenarios").iterdir())
    return sorted(p for p in entries if p.name.endswith(_SUFFIX) and p.is_file())


def example_path(name: str) -> Path | None:
    """The bundled scenario called ``name`` (with or without ``.jsonl``), or None."""
    wanted = name if name.endswith(_SUFFIX) else f"{name}{_SUFFIX}"
    return next((p for p in example_paths() if p.name == wanted), None)
