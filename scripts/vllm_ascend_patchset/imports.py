"""Static view of ``vllm_ascend`` imports: which module a file is, what it imports, what it defines.

Used to order the upstream mail series (``diffs``) and, by the tests, to check every
commit of it. Imports are read at any depth (a function-level import is as much a
dependency as a module-level one); relative imports are resolved to absolute names. A
string constant naming an object in a module (``"vllm_ascend.models.qwen3:Qwen3Model"``,
``"vllm_ascend.core.scheduler.Scheduler"``), as registries and config take them, counts
as an import of it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .paths import PACKAGE

RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.", re.M)
OBJECT_PATH = re.compile(rf"""["']({PACKAGE}(?:\.\w+)*)[.:](\w+)["']""")  # a whole string literal


def module_of(repo_path: str) -> str | None:
    """``vllm_ascend/core/x.py`` -> ``vllm_ascend.core.x``; a package's ``__init__.py`` -> the package."""
    if not repo_path.endswith(".py") or not repo_path.startswith(PACKAGE + "/"):
        return None
    parts = repo_path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(text: str, repo_path: str) -> set[tuple[str, tuple[str, ...]]]:
    """(module, imported names) of every ``vllm_ascend`` import in a file; ``()`` for ``import M``."""
    if PACKAGE not in text and not RELATIVE_IMPORT.search(text):
        return set()  # nothing to find: skip the parse
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    module = module_of(repo_path) or ""
    package = module if repo_path.endswith("__init__.py") else module.rpartition(".")[0]
    out: set[tuple[str, tuple[str, ...]]] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            out |= {(alias.name, ()) for alias in node.names if alias.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == PACKAGE:
                out.add((target, tuple(sorted(alias.name for alias in node.names if alias.name != "*"))))
    out |= {(m.group(1), (m.group(2),)) for m in OBJECT_PATH.finditer(text)}
    return out


def _statements(body: list):
    """Every statement, at any depth (imports are statements: expressions need no visit)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, None) or [])


def imported_modules(text: str, repo_path: str) -> set[str]:
    """Every ``vllm_ascend`` module a file imports, ``from M import sub`` counting ``M.sub`` too."""
    out = set()
    for target, names in import_statements(text, repo_path):
        out.add(target)
        out |= {f"{target}.{name}" for name in names}
    return out


def defined_names(text: str) -> set[str]:
    """Names a module defines at top level (also inside top-level if/try/with blocks)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    visit(block)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    try:
        visit(ast.parse(text).body)
    except SyntaxError:
        pass
    return names


def redefined_names(before: str, after: str) -> set[str]:
    """Top-level names whose definition (a def, a class, an assignment) reads differently after a change."""

    def definitions(text: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out[node.name] = ast.dump(node)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for name in (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                    out[name] = ast.dump(node)
        return out

    old, new = definitions(before), definitions(after)
    return {name for name, text in new.items() if old.get(name) != text}


def missing_names(text: str, package_dir: Path, names: tuple[str, ...]) -> list[str]:
    """The names ``from M import ...`` would not find in M's ``text``: neither defined nor a submodule
    (``package_dir``: M's folder, if M is a package)."""
    defined = defined_names(text)
    return [
        n
        for n in names
        if n not in defined and not (package_dir / f"{n}.py").is_file() and not (package_dir / n).is_dir()
    ]
