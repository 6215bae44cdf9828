"""Each core module's ``__all__`` names exactly its public definitions (what the
API reference documents and ``from leaseproto.core.x import *`` gives)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "leaseproto" / "core"
MODULES = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
#: public names other core modules use that are not part of the API
INTERNAL = {
    "rules": {"watch"},
    "specialise": {"Form", "Printer", "assume", "simplify"},
    "wire": {"id_problem"},
}


def _public_definitions(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return {n for n in names if not n.startswith("_")}


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_every_public_definition_and_nothing_missing(name: str) -> None:
    mod = importlib.import_module(f"leaseproto.core.{name}")
    exported = getattr(mod, "__all__", None)
    assert isinstance(exported, list), f"core/{name}.py has no __all__ list"
    assert len(set(exported)) == len(exported), f"core/{name}.py: __all__ repeats a name"
    for n in exported:
        assert hasattr(mod, n), f"core/{name}.py: __all__ names {n}, which it lacks"
    missing = _public_definitions(CORE / f"{name}.py") - set(exported) - INTERNAL.get(name, set())
    assert not missing, f"core/{name}.py defines {sorted(missing)} but does not export them"
