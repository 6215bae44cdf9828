"""Each core module's ``__all__`` names exactly its public definitions (what the
API reference documents and ``from leaseproto.core.x import *`` gives)."""

from __future__ import annotations

import ast
import importlib
import inspect
import typing
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "leaseproto" / "core"
MODULES = sorted(p.stem for p in CORE.glob("*.py") if p.stem != "__init__")
#: public names other core modules (or proofs/loops.py: the hot loops it runs on z3 terms)
#: use that are not part of the API
INTERNAL = {
    "renewal": {"renew_ids", "renew_capped"},
    "table": {"expire_end"},
    "wire_ids": {"id_problem"},
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


@pytest.mark.parametrize("name", MODULES)
def test_every_exported_annotation_resolves(name: str) -> None:
    """``typing.get_type_hints`` (what the API reference and runtime type checkers read)
    resolves the annotations of each exported function and class and of its methods:
    each name an annotation uses is defined in the module."""
    mod = importlib.import_module(f"leaseproto.core.{name}")
    for n in mod.__all__:
        obj = getattr(mod, n)
        objs = [obj]
        if inspect.isclass(obj):
            objs += [v for v in vars(obj).values() if inspect.isfunction(v)]
        for o in objs:
            if inspect.isfunction(o) or inspect.isclass(o):
                typing.get_type_hints(o)
