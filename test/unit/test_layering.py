"""The package's import structure (docs/architecture.md, "Who imports whom"): imports sit at the top of modules,
modules offer public names instead of being reached into, the mixins reach the Tensor class without importing
tensor.py, and the stages below the frontend never import it. Counted on the source with `ast`."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "fusegrad"
LOWER = ("ir", "schedule", "codegen", "renderer", "runtime", "engine")
FRONTEND = ("fusegrad.tensor", "fusegrad.mixin")
MAX_FUNCTION_LEVEL, MAX_UNDERSCORE = 60, 20


def _imports(path: pathlib.Path) -> list[tuple[ast.stmt, bool]]:
    """(import statement, whether it is inside a function) for every import outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    out: list[tuple[ast.stmt, bool]] = []

    def walk(node: ast.AST, in_fn: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for c in child.orelse: walk(c, in_fn)   # (only the else branch runs)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)): out.append((child, in_fn))
            walk(child, in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    walk(tree, False)
    return out


def _modules(stmt: ast.stmt) -> list[str]:
    """The modules an import statement loads (`from fusegrad import storage` loads fusegrad.storage)."""
    if isinstance(stmt, ast.Import): return [a.name for a in stmt.names]
    assert isinstance(stmt, ast.ImportFrom)
    mod = stmt.module or ""
    return [mod] + [f"{mod}.{a.name}" for a in stmt.names]


FILES = sorted(ROOT.rglob("*.py"))
ALL = {p: _imports(p) for p in FILES}


def test_imports_are_at_the_top():
    inside = [f"{p.relative_to(ROOT.parent)}:{s.lineno}: {ast.unparse(s)}" for p, imps in ALL.items()
              for s, in_fn in imps if in_fn]
    assert len(inside) <= MAX_FUNCTION_LEVEL, "\n".join(inside)


def test_few_imports_of_underscore_names():
    under = [f"{p.relative_to(ROOT.parent)}:{s.lineno}: {ast.unparse(s)}" for p, imps in ALL.items() for s, _ in imps
             if isinstance(s, ast.ImportFrom) and any(a.name.startswith("_") and not a.name.startswith("__")
                                                      for a in s.names)]
    assert len(under) <= MAX_UNDERSCORE, "\n".join(under)


def _frontend_imports(paths: list[pathlib.Path]) -> list[str]:
    return [f"{p.relative_to(ROOT.parent)}:{s.lineno}: {ast.unparse(s)}" for p in paths for s, _ in ALL[p]
            if any(m == f or m.startswith(f + ".") for m in _modules(s) for f in FRONTEND)]


def test_mixins_never_import_tensor_py():
    found = [line for line in _frontend_imports(sorted((ROOT / "mixin").glob("*.py"))) if "fusegrad.tensor" in line]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("stage", LOWER)
def test_lower_stages_never_import_the_frontend(stage):
    found = _frontend_imports(sorted((ROOT / stage).rglob("*.py")))
    assert not found, "\n".join(found)


def test_the_counter_sees_imports_in_functions_and_skips_type_checking(tmp_path):
    # the counter itself can fail: an import inside a function counts, one under TYPE_CHECKING doesn't
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fusegrad.tensor import Tensor\n"
                   "def f():\n    from fusegrad.mixin.alu import _x\n")
    got = [(ast.unparse(s), in_fn) for s, in_fn in _imports(src)]
    assert got == [("from typing import TYPE_CHECKING", False), ("from fusegrad.mixin.alu import _x", True)]
