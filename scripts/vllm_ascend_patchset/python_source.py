"""Python source read as syntax trees, never imported: what the contracts know of upstream's and our code.

Parsed once per content (``parse_file``): every port reads the overlay and upstream's
ascend_config.py and attention_v1.py, mostly unchanged between ports, and the tests run
many ports in one process. The trees are only read, never changed; so are the analyses
cached on them: the classes a module defines and their attributes (``ClassAttrs``), the
string literals in each class (``class_strings``), a module's string constants
(``module_constants``).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path


class ContractError(ValueError):
    """A source file the contracts read is missing or not what they expect."""


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> ast.Module:
    """A module's tree, parsed once per content (see the module doc)."""
    return ast.parse(text)


def parse_file(path: Path) -> ast.Module:
    text = path.read_text()
    try:
        return _parsed(text)
    except SyntaxError as exc:
        exc.filename = str(path)
        raise


def class_def(tree: ast.Module, name: str, source: str = "source") -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise ContractError(f"{source}: no class {name}")


@dataclass(frozen=True)
class ClassInfo:
    classes: dict[str, ast.ClassDef]
    attrs: dict[str, frozenset[str]]  # class -> attributes it defines
    types: dict[tuple[str, str], str]  # (class, attribute) -> the class of the attribute's value, when known


@functools.lru_cache(maxsize=64)
def class_info(tree: ast.Module) -> ClassInfo:
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    attrs: dict[str, frozenset[str]] = {}
    types: dict[tuple[str, str], str] = {}

    def note_type(cls: str, attr: str, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id in classes:
            types[(cls, attr)] = node.id

    for name, cls in classes.items():
        names: set[str] = set()
        for node in cls.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
                note_type(name, node.target.id, node.annotation)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(cls):
            targets: list[ast.AST] = []
            value = None
            if isinstance(node, ast.Assign):
                targets, value = list(node.targets), node.value
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets, value = [node.target], node.value
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
                        if isinstance(value, ast.Call):
                            note_type(name, t.attr, value.func)
        attrs[name] = frozenset(names)
    return ClassInfo(classes, attrs, types)


class ClassAttrs:
    """Attributes each class of a module defines (plus ``extra``), and the class an attribute holds when known."""

    def __init__(self, tree: ast.Module, extra: dict[str, set[str]] | None = None) -> None:
        info = class_info(tree)
        self.classes = info.classes
        self.types = info.types
        self.attrs = {name: set(names) for name, names in info.attrs.items()}
        for name, more in (extra or {}).items():
            self.attrs.setdefault(name, set()).update(more)

    def resolve(self, cls: str, path: tuple[str, ...]) -> tuple[bool, str]:
        """(found, how far): walks the path while the holding class is known."""
        walked = cls
        for i, part in enumerate(path):
            if part not in self.attrs.get(cls, set()):
                return False, f"{walked} has no attribute {part}"
            walked += f".{part}"
            nxt = self.types.get((cls, part))
            if nxt is None:
                rest = path[i + 1 :]
                return True, walked + (f" (the rest, .{'.'.join(rest)}, is not checked)" if rest else "")
            cls = nxt
        return True, walked


def module_constants(tree: ast.Module) -> dict[str, str]:
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                consts[node.targets[0].id] = node.value.value
    return consts


@functools.lru_cache(maxsize=64)
def class_strings(tree: ast.Module) -> dict[str, frozenset[str]]:
    """Class name -> the string literals in its code (where upstream reads a config key)."""
    return {
        cls.name: frozenset(n.value for n in ast.walk(cls) if isinstance(n, ast.Constant) and isinstance(n.value, str))
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
    }
