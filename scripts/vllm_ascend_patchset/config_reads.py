"""What our overlay and patches read of upstream's configuration, found in their source.

- ``overlay_config_reads``: the ``AscendConfig`` attribute chains each overlay module reads
  (``ascend_config.x``, ``getattr(ascend_config, "x", default)``, also through a local
  variable or a loop over literal names, and the dotted paths of an ``ASCEND_CONFLICTS``
  table).
- ``patch_config_attrs``: the ``self.x`` our patches assign and read inside a file.
- ``config_keys``: the ``additional_config`` keys our overlay reads, and where.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .hunks import parse_diff
from .paths import PACKAGE
from .python_source import module_constants, parse_file


@dataclass(frozen=True)
class ConfigRead:
    path: tuple[str, ...]  # attribute names below AscendConfig
    where: str  # overlay file:line


def _is_config_root(node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Name) and func.id == "get_ascend_config") or (
            isinstance(func, ast.Attribute) and func.attr == "get_ascend_config"
        )
    return (isinstance(node, ast.Name) and node.id == "ascend_config") or (
        isinstance(node, ast.Attribute) and node.attr == "ascend_config"
    )


class _ConfigReads(ast.NodeVisitor):
    """Attribute chains below an AscendConfig object, one function at a time."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.reads: list[ConfigRead] = []
        self.aliases: dict[str, tuple[str, ...]] = {}  # local name -> chain it holds
        self.loop_names: dict[str, list[str]] = {}  # loop variable -> literal names it takes

    def _paths(self, node: ast.AST) -> list[tuple[str, ...]]:
        if _is_config_root(node):
            return [()]
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return [self.aliases[node.id]]
        if isinstance(node, ast.Attribute):
            return [p + (node.attr,) for p in self._paths(node.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            if len(node.args) >= 2:
                names: list[str] = []
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names = [arg.value]
                elif isinstance(arg, ast.Name):
                    names = self.loop_names.get(arg.id, [])
                return [p + (n,) for p in self._paths(node.args[0]) for n in names]
        return []

    def _record(self, node: ast.AST) -> None:
        for path in self._paths(node):
            if path:
                self.reads.append(ConfigRead(path, f"{self.where}:{node.lineno}"))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        saved = dict(self.aliases), dict(self.loop_names)
        self.generic_visit(node)
        self.aliases, self.loop_names = saved

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        paths = self._paths(node.value)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and len(paths) == 1:
            self.aliases[node.targets[0].id] = paths[0]

    def visit_For(self, node: ast.For) -> None:
        if isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple | ast.List | ast.Set):
            values = [e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(values) == len(node.iter.elts):
                self.loop_names[node.target.id] = values
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._record(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            self._record(node)
        self.generic_visit(node)


def overlay_trees(overlay_dir: Path) -> dict[str, ast.Module]:
    return {p.relative_to(overlay_dir).as_posix(): parse_file(p) for p in sorted(overlay_dir.rglob("*.py"))}


FLAG_TABLE = "ASCEND_CONFLICTS"  # a module-level table whose entries start with an AscendConfig attribute path


def _flag_table_reads(rel: str, tree: ast.Module) -> list[ConfigRead]:
    """The dotted AscendConfig paths a module lists in its ``ASCEND_CONFLICTS`` table (read by name at run time)."""
    reads = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if not any(isinstance(t, ast.Name) and t.id == FLAG_TABLE for t in targets):
            continue
        for entry in getattr(node.value, "elts", []):
            first = entry.elts[0] if isinstance(entry, ast.Tuple) and entry.elts else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                reads.append(ConfigRead(tuple(first.value.split(".")), f"{rel}:{first.lineno}"))
    return reads


def overlay_config_reads(overlay_dir: Path, trees: dict[str, ast.Module] | None = None) -> list[ConfigRead]:
    """The longest AscendConfig attribute chains each overlay module reads."""
    reads: list[ConfigRead] = []
    for rel, tree in (trees or overlay_trees(overlay_dir)).items():
        reads += [read for read in _module_config_reads(rel, tree) if read not in reads]
    return reads


@functools.lru_cache(maxsize=256)
def _module_config_reads(rel: str, tree: ast.Module) -> tuple[ConfigRead, ...]:
    visitor = _ConfigReads(rel)
    visitor.visit(tree)
    found = visitor.reads + _flag_table_reads(rel, tree)
    # keep a chain only when no longer chain read at the same place extends it
    return tuple(
        dict.fromkeys(
            read
            for read in found
            if not any(
                o.where == read.where and len(o.path) > len(read.path) and o.path[: len(read.path)] == read.path
                for o in found
            )
        )
    )


def patch_config_attrs(patches: Iterable, relpath: str) -> tuple[set[str], list[tuple[str, str]]]:
    """(names our patches assign as self.x, (name, patch) for each self.x they read) in one file."""
    assigned: set[str] = set()
    read: list[tuple[str, str]] = []
    for patch in patches:
        for fd in parse_diff(patch.diff, patch.name):
            if fd.path != f"{PACKAGE}/{relpath}":
                continue
            for hunk in fd.hunks:
                for line in hunk.added:
                    assigned.update(re.findall(r"\bself\.(\w+)\s*(?::[^=]*)?=(?!=)", line))
                    for name in re.findall(r"\bself\.(\w+)\b(?!\s*(?::[^=]*)?=(?!=))", line):
                        if (name, patch.name) not in read:
                            read.append((name, patch.name))
    return assigned, read


def _is_additional_config(node: ast.AST) -> bool:
    """``additional_config``, ``x.additional_config``, ``additional`` or ``(one of them or {})``."""
    if isinstance(node, ast.BoolOp) and node.values:
        node = node.values[0]
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("additional_config", "additional")


def config_keys(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """additional_config keys our overlay reads -> where: literal or constant keys of .get() and []."""
    return {key: list(where) for key, where in _config_keys_of(tuple(trees.items())).items()}


@functools.lru_cache(maxsize=32)
def _config_keys_of(items: tuple[tuple[str, ast.Module], ...]) -> dict[str, tuple[str, ...]]:
    trees = dict(items)
    module_consts = {rel: module_constants(tree) for rel, tree in trees.items()}
    keys: dict[str, list[str]] = {}
    for rel, tree in trees.items():
        consts = dict(module_consts[rel])
        for node in tree.body:  # constants imported from another overlay module
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm_ascend."):
                source = module_consts.get(node.module.removeprefix("vllm_ascend.").replace(".", "/") + ".py", {})
                for alias in node.names:
                    if alias.name in source:
                        consts[alias.asname or alias.name] = source[alias.name]
        for node in ast.walk(tree):
            key_node = None
            holder = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                holder, key_node = node.func.value, node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript):
                holder, key_node = node.value, node.slice
            if holder is None or key_node is None or not _is_additional_config(holder):
                continue
            key = None
            if isinstance(key_node, ast.Constant) and isinstance(key_node.value, str):
                key = key_node.value
            elif isinstance(key_node, ast.Name) and key_node.id in consts:
                key = consts[key_node.id]
            if key:
                keys.setdefault(key, []).append(f"{rel}:{node.lineno}")
    return {key: tuple(where) for key, where in keys.items()}
