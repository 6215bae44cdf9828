"""The mutants of the mutation run (tools/mutation_run.py): where they are and how
each changes the source.

A mutant changes one node of one core module: a comparison (``<`` to ``<=``...),
an arithmetic operator (``+`` to ``-``, ``*`` to ``//``), ``max``/``min``
(``vmax``/``vmin``, ``conj``/``disj``: the rule helpers of ``core/sym.py``), a
boolean operator (``and`` to ``or``), ``not`` dropped, an integer or boolean
constant (``n`` to ``n + 1``, ``True`` to ``False``), a return value (to
``None``) or a simple statement (deleted: replaced by ``pass``). Its key names
the module, the enclosing function, the change and the source of the node, so
it survives edits elsewhere in the file; sampling is by a hash of the key.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "leaseproto" / "core"
#: every core module with code; those in SAMPLED are sampled (``--sample``)
SAMPLED = ("table.py", "wire.py", "wire_ids.py", "config.py")
MODULES = (
    "rules.py",
    "state.py",
    "sym.py",
    "tracker.py",
    "clock.py",
    "checks.py",
    "lease.py",
    "peer.py",
    "events.py",
    "errors.py",
    "deadlines.py",
    "renewal.py",
    *SAMPLED,
)
SWAP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
SWAP_BIN: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
}
SWAP_NAME = {"max": "min", "min": "max", "vmax": "vmin", "vmin": "vmax", "conj": "disj"}
SWAP_NAME["disj"] = "conj"


@dataclass(frozen=True)
class Mutant:
    module: str
    key: str
    #: the node's position in :func:`sites`' order (valid for this source only)
    index: int
    line: int
    end_line: int
    func: str
    what: str
    #: the node sits in a function body (else: module or class level, run at import)
    in_body: bool

    def where(self) -> str:
        return f"{self.module}:{self.line} {self.func}"


def _what(node: ast.AST) -> str | None:
    if isinstance(node, ast.Compare) and type(node.ops[0]) in SWAP_CMP:
        return f"{type(node.ops[0]).__name__} -> {SWAP_CMP[type(node.ops[0])].__name__}"
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        return f"{type(node.op).__name__} -> {SWAP_BIN[type(node.op)].__name__}"
    if isinstance(node, ast.AugAssign) and type(node.op) in SWAP_BIN:
        return f"{type(node.op).__name__}= -> {SWAP_BIN[type(node.op)].__name__}="
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SWAP_NAME:
        return f"{node.func.id} -> {SWAP_NAME[node.func.id]}"
    if isinstance(node, ast.BoolOp):
        return "and -> or" if isinstance(node.op, ast.And) else "or -> and"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return "not dropped"
    if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
        return f"constant {node.value!r} -> {_const(node.value)!r}"
    if (
        isinstance(node, ast.Return)
        and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
    ):
        return "return None"
    return None


def _const(v: int | bool) -> int | bool:
    return (not v) if isinstance(v, bool) else v + 1


def _deletable(node: ast.AST) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return not (isinstance(node, ast.AnnAssign) and node.value is None)
    if isinstance(node, ast.Expr):
        return not isinstance(node.value, ast.Constant)  # a docstring
    return isinstance(node, (ast.Raise, ast.Delete))


def sites(tree: ast.AST) -> list[tuple[ast.AST, str, str, bool]]:
    """(node, change, enclosing qualname, in a function body), in a fixed order."""
    out: list[tuple[ast.AST, str, str, bool]] = []

    def visit(node: ast.AST, qual: str, body: bool) -> None:
        what = _what(node)
        if what is not None:
            out.append((node, what, qual, body))
        if _deletable(node):
            out.append((node, "statement deleted", qual, body))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{qual}.{node.name}" if qual else node.name
            for d in [*node.decorator_list, node.args, *([node.returns] if node.returns else [])]:
                visit(d, qual, body)
            for stmt in node.body:
                visit(stmt, name, True)
            return
        if isinstance(node, ast.ClassDef):
            name = f"{qual}.{node.name}" if qual else node.name
            for d in [*node.decorator_list, *node.bases, *node.keywords]:
                visit(d, qual, body)
            for stmt in node.body:
                visit(stmt, name, body)
            return
        if isinstance(node, (ast.AnnAssign, ast.arg)):  # annotations are never run
            if isinstance(node, ast.AnnAssign):
                visit(node.target, qual, body)
                if node.value is not None:
                    visit(node.value, qual, body)
            return
        if isinstance(node, ast.arguments):
            for d in [*node.defaults, *[k for k in node.kw_defaults if k is not None]]:
                visit(d, qual, body)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, qual, body)

    visit(tree, "", False)
    return out


def _sampled(key: str, sample: float) -> bool:
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return h / 2**32 < sample


def mutants(sample: float = 0.5, modules: tuple[str, ...] = MODULES) -> list[Mutant]:
    out: list[Mutant] = []
    for mod in modules:
        seen: dict[str, int] = {}
        tree = ast.parse((CORE / mod).read_text())
        for i, (node, what, qual, body) in enumerate(sites(tree)):
            snippet = ast.unparse(node).splitlines()[0][:70] if node else ""
            base = f"{mod}:{qual or '<module>'}:{what}:{snippet}"
            k = seen[base] = seen.get(base, -1) + 1
            key = f"{base}#{k}"
            if mod in SAMPLED and not _sampled(key, sample):
                continue
            line = getattr(node, "lineno", 0)
            out.append(
                Mutant(
                    mod, key, i, line, getattr(node, "end_lineno", line) or line, qual, what, body
                )
            )
    return out


def mutated_source(m: Mutant) -> str:
    """The module's source with ``m`` applied (unparsed: comments are gone)."""
    tree = ast.parse((CORE / m.module).read_text())
    node, what, _, _ = sites(tree)[m.index]
    _apply(node, what)
    return ast.unparse(ast.fix_missing_locations(tree))


def _apply(node: ast.AST, what: str) -> None:
    if what == "statement deleted":
        node.__class__ = ast.Pass
        for f in list(node._fields):
            if hasattr(node, f):
                delattr(node, f)
    elif isinstance(node, ast.Compare):
        node.ops[0] = SWAP_CMP[type(node.ops[0])]()
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = SWAP_BIN[type(node.op)]()
    elif isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        node.func.id = SWAP_NAME[node.func.id]
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        node.__class__ = ast.Call  # not x -> bool(x)
        node.func, node.args, node.keywords = ast.Name("bool", ast.Load()), [node.operand], []
        del node.op, node.operand
    elif isinstance(node, ast.Constant):
        node.value = _const(node.value)
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)
    else:
        raise AssertionError(what)
