"""What our code assumes of upstream, checked from source (nothing is imported).

Two contracts, read with ``ast`` so they run on any upstream checkout without an NPU,
torch_npu or even vLLM:

- Metadata: every field of ``AscendMetadata`` (attention/attention_v1.py) is one the
  dual-stream splitter knows (``dual_stream/split.py``: handled, passed through or
  required at its default), and every field it knows still exists. A field the
  splitter does not know would be copied unsplit into both micro-batches.
- Config: every ``AscendConfig`` attribute our overlay reads (``ascend_config.x``,
  ``getattr(ascend_config, "x", default)``, also through a local variable or a loop over
  literal names) and every ``self.x`` our patches add inside ``AscendConfig`` still
  exists at the target; and every ``additional_config`` key our overlay reads is read
  by upstream in the same place as at the pin. Reads through ``getattr`` with a default
  never fail at run time, so a flag upstream dropped would silently turn a check off.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ATTENTION_V1 = "attention/attention_v1.py"  # under vllm_ascend/
ASCEND_CONFIG = "ascend_config.py"
SPLITTER = "dual_stream/split.py"  # under the overlay
SPLITTER_SETS = ("HANDLED_FIELDS", "PASSTHROUGH_FIELDS", "REQUIRED_DEFAULT_FIELDS")
CONFIG_CLASS = "AscendConfig"


class ContractError(ValueError):
    """A source file the contracts read is missing or not what they expect."""


@dataclass(frozen=True)
class ContractResult:
    subject: str  # what is checked, stable across line moves (a target can answer it by this)
    ok: bool
    detail: str
    where: str = ""  # the file (or patch and line) it is read at

    @property
    def name(self) -> str:
        return f"{self.subject} ({self.where})" if self.where else self.subject


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> ast.Module:
    """A module's tree, parsed once per content: every port reads the overlay and upstream's
    ascend_config.py and attention_v1.py, mostly unchanged between ports (the tests run many in
    one process). The trees are only read, never changed; so are the analyses cached on them."""
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


def ascend_metadata_fields(attention_v1: Path) -> list[str]:
    """The annotated fields of ``AscendMetadata``, in declaration order."""
    cls = class_def(parse_file(attention_v1), "AscendMetadata", str(attention_v1))
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def splitter_field_sets(split_py: Path) -> dict[str, frozenset[str]]:
    """The splitter's field sets as literals in its source (it imports torch, so it is not imported)."""
    found: dict[str, frozenset[str]] = {}
    for node in parse_file(split_py).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        if not isinstance(target, ast.Name) or target.id not in SPLITTER_SETS or node.value is None:
            continue
        value = node.value
        if isinstance(value, ast.Call) and len(value.args) == 1:  # frozenset({...})
            value = value.args[0]
        try:
            found[target.id] = frozenset(ast.literal_eval(value))
        except ValueError as exc:
            raise ContractError(f"{split_py}: {target.id} is not a literal set or dict of field names") from exc
    missing = [name for name in SPLITTER_SETS if name not in found]
    if missing:
        raise ContractError(f"{split_py}: no literal {', '.join(missing)}; the metadata contract reads them")
    return found


def metadata_contract(package: Path, overlay_dir: Path) -> list[ContractResult]:
    """``package`` holds the target's vllm_ascend files; the splitter is ours."""
    name, where = "AscendMetadata fields", ATTENTION_V1
    try:
        fields = ascend_metadata_fields(package / ATTENTION_V1)
        known = frozenset().union(*splitter_field_sets(overlay_dir / SPLITTER).values())
    except (OSError, SyntaxError, ContractError) as exc:
        return [ContractResult(name, False, str(exc), where)]
    new = [f for f in fields if f not in known]
    gone = sorted(known - set(fields))
    problems = []
    if new:
        problems.append(f"new field(s) {', '.join(new)}: decide in dual_stream/split.py how each is split")
    if gone:
        problems.append(f"field(s) {', '.join(gone)} no longer exist: drop them from dual_stream/split.py")
    return [ContractResult(name, not problems, "; ".join(problems) or f"{len(fields)} fields, all known", where)]


# ----------------------------------------------------------------------------- config


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


def _overlay_trees(overlay_dir: Path) -> dict[str, ast.Module]:
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
    for rel, tree in (trees or _overlay_trees(overlay_dir)).items():
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


@dataclass(frozen=True)
class _ClassInfo:
    classes: dict[str, ast.ClassDef]
    attrs: dict[str, frozenset[str]]  # class -> attributes it defines
    types: dict[tuple[str, str], str]  # (class, attribute) -> the class of the attribute's value, when known


@functools.lru_cache(maxsize=64)
def _class_info(tree: ast.Module) -> _ClassInfo:
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
    return _ClassInfo(classes, attrs, types)


class _ClassAttrs:
    """Attributes each class of a module defines (plus ``extra``), and the class an attribute holds when known."""

    def __init__(self, tree: ast.Module, extra: dict[str, set[str]] | None = None) -> None:
        info = _class_info(tree)
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


def _patch_config_attrs(patches: Iterable, relpath: str) -> tuple[set[str], list[tuple[str, str]]]:
    """(names our patches assign as self.x, (name, patch) for each self.x they read) in one file."""
    from .hunks import parse_diff

    assigned: set[str] = set()
    read: list[tuple[str, str]] = []
    for patch in patches:
        for fd in parse_diff(patch.diff, patch.name):
            if fd.path != f"vllm_ascend/{relpath}":
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


def _module_constants(tree: ast.Module) -> dict[str, str]:
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                consts[node.targets[0].id] = node.value.value
    return consts


def _config_keys(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """additional_config keys our overlay reads -> where: literal or constant keys of .get() and []."""
    return {key: list(where) for key, where in _config_keys_of(tuple(trees.items())).items()}


@functools.lru_cache(maxsize=32)
def _config_keys_of(items: tuple[tuple[str, ast.Module], ...]) -> dict[str, tuple[str, ...]]:
    trees = dict(items)
    module_consts = {rel: _module_constants(tree) for rel, tree in trees.items()}
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


@functools.lru_cache(maxsize=64)
def _class_strings(tree: ast.Module) -> dict[str, frozenset[str]]:
    """Class name -> the string literals in its code (where upstream reads a config key)."""
    return {
        cls.name: frozenset(n.value for n in ast.walk(cls) if isinstance(n, ast.Constant) and isinstance(n.value, str))
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
    }


def _key_readers(strings: dict[str, frozenset[str]], key: str) -> set[str]:
    return {cls for cls, found in strings.items() if key in found}


def config_contract(target_pkg: Path, pinned_pkg: Path, overlay_dir: Path, patches: Iterable) -> list[ContractResult]:
    """Config reads of our overlay and patches, against the target's ascend_config.py (the pin's as reference)."""
    patches = list(patches)
    results: list[ContractResult] = []
    try:
        target_tree = parse_file(target_pkg / ASCEND_CONFIG)
        pinned_tree = parse_file(pinned_pkg / ASCEND_CONFIG)
    except (OSError, SyntaxError) as exc:
        return [ContractResult("config", False, str(exc), ASCEND_CONFIG)]
    assigned, patch_reads = _patch_config_attrs(patches, ASCEND_CONFIG)
    target = _ClassAttrs(target_tree, {CONFIG_CLASS: assigned})
    pinned = _ClassAttrs(pinned_tree, {CONFIG_CLASS: assigned})
    if CONFIG_CLASS not in target.classes:
        return [ContractResult("config", False, f"the target has no class {CONFIG_CLASS}", ASCEND_CONFIG)]

    try:
        trees = _overlay_trees(overlay_dir)
    except SyntaxError as exc:  # e.g. the conflict markers of a target's overlay patch
        where = Path(exc.filename or "?")
        where = where.relative_to(overlay_dir) if where.is_relative_to(overlay_dir) else where
        detail = f"overlay file {where}:{exc.lineno} does not parse ({exc.msg}); resolve it (conflict markers?)"
        return results + [ContractResult("config", False, detail, "overlay")]
    by_path: dict[tuple[str, ...], list[str]] = {}
    for read in overlay_config_reads(overlay_dir, trees):
        by_path.setdefault(read.path, []).append(read.where)
    for name, patch in patch_reads:
        if name not in assigned:
            by_path.setdefault((name,), []).append(patch)
    for path, where in by_path.items():
        name = f"{CONFIG_CLASS}.{'.'.join(path)}"
        at_pin, _ = pinned.resolve(CONFIG_CLASS, path)
        found, detail = target.resolve(CONFIG_CLASS, path)
        if not found and not at_pin:
            found, detail = True, "not defined in ascend_config.py at the pin either: not checked"
        elif not found:
            detail += " at the target (the pin has it): find where the setting went and read it there"
        results.append(ContractResult(name, found, detail, f"read at {', '.join(where)}"))

    pinned_strings, target_strings = _class_strings(pinned_tree), _class_strings(target_tree)
    for key, where in sorted(_config_keys(trees).items()):
        name = f"additional_config key {key!r}"
        before, after = _key_readers(pinned_strings, key), _key_readers(target_strings, key)
        moved = bool(before) and before != after
        if moved:
            detail = (
                f"upstream reads it in {', '.join(sorted(after)) or 'no class'} at the target, "
                f"in {', '.join(sorted(before)) or 'no class'} at the pin: it moved; read it where upstream does "
                "and keep the old place as a deprecated alias"
            )
        elif before != after:
            detail = f"read by {', '.join(sorted(after))} at the target, ours alone at the pin"
        elif after:
            detail = f"read by {', '.join(sorted(after))}, as at the pin"
        else:
            detail = "ours alone (upstream reads it nowhere)"
        results.append(ContractResult(name, not moved, detail, f"read at {', '.join(where)}"))
    return results
