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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .config_reads import config_keys, overlay_config_reads, overlay_trees, patch_config_attrs
from .python_source import ClassAttrs, ContractError, class_def, class_strings, parse_file

ATTENTION_V1 = "attention/attention_v1.py"  # under vllm_ascend/
ASCEND_CONFIG = "ascend_config.py"
SPLITTER = "dual_stream/split.py"  # under the overlay
SPLITTER_SETS = ("HANDLED_FIELDS", "PASSTHROUGH_FIELDS", "REQUIRED_DEFAULT_FIELDS")
CONFIG_CLASS = "AscendConfig"


@dataclass(frozen=True)
class ContractResult:
    subject: str  # what is checked, stable across line moves (a target can answer it by this)
    ok: bool
    detail: str
    where: str = ""  # the file (or patch and line) it is read at

    @property
    def name(self) -> str:
        return f"{self.subject} ({self.where})" if self.where else self.subject


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
    assigned, patch_reads = patch_config_attrs(patches, ASCEND_CONFIG)
    target = ClassAttrs(target_tree, {CONFIG_CLASS: assigned})
    pinned = ClassAttrs(pinned_tree, {CONFIG_CLASS: assigned})
    if CONFIG_CLASS not in target.classes:
        return [ContractResult("config", False, f"the target has no class {CONFIG_CLASS}", ASCEND_CONFIG)]

    try:
        trees = overlay_trees(overlay_dir)
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

    pinned_strings, target_strings = class_strings(pinned_tree), class_strings(target_tree)
    for key, where in sorted(config_keys(trees).items()):
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
