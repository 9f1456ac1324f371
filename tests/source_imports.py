"""The import statements of a Python file, read from its source (nothing is imported).

Shared by the tests' tier split (``tiers.py``: what a test needs) and the tooling's
architecture checks (``tooling/test_architecture.py``: import circles, private names).
Relative imports are resolved to absolute names; each import says whether it runs when
the module is imported (``top_level``, not inside a function or class body) and whether
it is ``optional`` (inside a ``try`` that handles ``ImportError``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


@dataclass(frozen=True)
class Import:
    module: str  # absolute dotted name: ``import M`` and ``from M import a`` both give M
    names: tuple[str, ...]  # the names of ``from M import a, b``; () for ``import M``
    line: int
    top_level: bool  # runs when the module is imported
    optional: bool  # guarded by ``except ImportError`` (or broader)
    function: str | None  # the outermost function or class it is inside, if any


def module_name(path: Path, root: Path) -> str:
    """``root/a/b.py`` -> ``a.b``; ``root/a/__init__.py`` -> ``a``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str) -> list[Import]:
    """Every import of the file ``path``, whose module name is ``name`` (for relative imports)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return list(_walk(tree.body, package, top_level=True, optional=False, function=None))


def _walk(
    body: list[ast.stmt], package: str, *, top_level: bool, optional: bool, function: str | None
) -> Iterator[Import]:
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, (), node.lineno, top_level, optional, function)
        elif isinstance(node, ast.ImportFrom):
            yield Import(
                _absolute(node, package), tuple(a.name for a in node.names), node.lineno, top_level, optional, function
            )
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = function or node.name
            yield from _walk(node.body, package, top_level=False, optional=optional, function=inner)
        elif isinstance(node, ast.Try):
            guarded = optional or any(_catches_import_error(h) for h in node.handlers)
            yield from _walk(node.body, package, top_level=top_level, optional=guarded, function=function)
            for block in (*(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _walk(block, package, top_level=top_level, optional=optional, function=function)
        else:  # if, for, while, with, match: their blocks run as the statement does
            for block in _blocks(node):
                yield from _walk(block, package, top_level=top_level, optional=optional, function=function)


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list):
            yield block
    for case in getattr(node, "cases", None) or []:
        yield case.body


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return handler.type is None or any(isinstance(k, ast.Name) and k.id in IMPORT_ERRORS for k in kinds)
