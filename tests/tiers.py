"""The two tiers of the tests: which test needs vLLM, torch or the assembled tree, read from its imports.

``make test`` runs every test. ``make test-fast`` (``pytest tests --fast``) runs those
that need none of vLLM, torch and the assembled tree; what a test needs is read from
source, before anything is imported:

- a test file's module-level imports, and those of every module they reach in tests/,
  scripts/ and the overlay (``vllm_ascend.x`` is ``vllm_ascend_overlay/x.py``; a module
  the overlay does not have is upstream's, from the assembled tree);
- the conftest.py files on the way to it (a directory whose conftest needs one is left
  out whole);
- the imports inside the test function itself;
- a helper module whose needs its imports do not show (it starts vLLM or torch in a
  subprocess) says so in a module-level string ``FULL_TIER``; a single test marks itself
  ``@pytest.mark.full_tier("why")``.

In the fast tier ``enter_fast_tier`` makes vLLM and torch unimportable, makes
``vllm_ascend`` the overlay folder itself and points ``PATCHSET_TARGET`` at a tree that
does not exist, so a test that needs more than its imports show fails there loudly.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

from source_imports import Import, imports_of, module_name
from vllm_ascend_patchset.paths import OVERLAY_DIR, PACKAGE, ROOT, SCRIPTS_DIR, TARGET_ENV, TESTS_DIR

HEAVY = {  # top-level package -> what the fast tier lacks
    "vllm": "vLLM",
    "torch": "torch",
    "torch_npu": "torch",
    "transformers": "torch (transformers)",
    "safetensors": "torch (safetensors)",
}
ASSEMBLED_TREE = "the assembled tree"
DECLARATION = "FULL_TIER"  # the name of a helper module's own statement of what it needs
NO_ASSEMBLED_TREE = "fast-tier-has-no-assembled-tree"  # the PATCHSET_TARGET of the fast tier: no such build


_NEEDS: dict[Path, str | None] = {}  # file -> what importing it needs, once known
_READING: set[Path] = set()  # files whose imports are being followed (an import circle stops there)


def file_needs(path: Path) -> str | None:
    """What importing ``path`` needs of vLLM, torch and the assembled tree (None: nothing), transitively."""
    path = path.resolve()
    if path in _NEEDS:
        return _NEEDS[path]
    if path in _READING:
        return None  # the rest of the circle is being read: it answers for itself
    _READING.add(path)
    try:
        need = _declared(path)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        need = f"{shown} ({need})" if need else None
        for imp in _imports(path):
            if need:
                break
            if imp.top_level and not imp.optional:
                need = _import_needs(imp, path)
    finally:
        _READING.discard(path)
    _NEEDS[path] = need
    return need


@functools.cache
def function_needs(path: Path, function: str) -> str | None:
    """What the imports inside the test function (or class) ``function`` of ``path`` need."""
    path = path.resolve()
    for imp in _imports(path):
        if imp.function == function and not imp.optional:
            need = _import_needs(imp, path)
            if need:
                return need
    return None


def directory_needs(folder: Path) -> str | None:
    """What the conftest.py of ``folder`` needs (a directory is left out whole when it needs one)."""
    conftest = folder / "conftest.py"
    return file_needs(conftest) if conftest.is_file() and folder.resolve() != TESTS_DIR else None


@functools.cache
def _imports(path: Path) -> tuple[Import, ...]:
    return tuple(imports_of(path, _name_of(path)))


def _declared(path: Path) -> str | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == DECLARATION for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def _name_of(path: Path) -> str:
    for root in (SCRIPTS_DIR, OVERLAY_DIR, TESTS_DIR):
        if path.is_relative_to(root):
            name = module_name(path, root)
            return f"{PACKAGE}.{name}" if root == OVERLAY_DIR else name
    return path.stem


def _import_needs(imp: Import, importer: Path) -> str | None:
    top = imp.module.split(".")[0]
    if top in HEAVY:
        return HEAVY[top]
    for target in _targets(imp, importer):
        if target is None:
            return f"{ASSEMBLED_TREE} ({imp.module})"
        need = file_needs(target)
        if need:
            return need
    return None


def _targets(imp: Import, importer: Path) -> list[Path | None]:
    """The files an import loads from tests/, scripts/ or the overlay; None for a vllm_ascend module the overlay
    does not have; nothing for a module from elsewhere (the standard library, numpy, pytest, ...)."""
    if imp.module == "conftest":  # the tests' own, whatever folder imports it
        return [TESTS_DIR / "conftest.py"]
    overlay = imp.module.split(".")[0] == PACKAGE
    roots = [OVERLAY_DIR] if overlay else [importer.parent, TESTS_DIR, SCRIPTS_DIR]
    parts = imp.module.split(".")[1:] if overlay else imp.module.split(".")
    found: list[Path | None] = []
    rest = []
    for name in imp.names or ("",):
        sub = _find(roots, [*parts, name]) if name and name != "*" else None
        if sub is not None:
            found.append(sub)
        else:
            rest.append(name)
    if rest:
        module = _find(roots, parts)
        if module is not None:
            found.append(module)
        elif overlay and not (rest == [""] and parts and OVERLAY_DIR.joinpath(*parts).is_dir()):
            found.append(None)  # upstream's module, or upstream's __init__ of a package (not one of our folders)
    return found


def _find(roots: list[Path], parts: list[str]) -> Path | None:
    if not parts:
        return None
    for root in roots:
        base = root.joinpath(*parts)
        for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


class _Unimportable(importlib.abc.MetaPathFinder):
    """vLLM and torch cannot be imported in the fast tier: an ImportError that says why."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(
                f"{fullname}: the fast tier runs without vLLM and torch; a test that needs them runs in 'make test' "
                "(tests/tiers.py says how a test is sorted)",
                name=fullname,
            )
        return None


def enter_fast_tier() -> None:
    """This process, for the fast tier: no vLLM, no torch, ``vllm_ascend`` the overlay, no assembled tree."""
    sys.meta_path.insert(0, _Unimportable())
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(OVERLAY_DIR)]
    package = importlib.util.module_from_spec(spec)
    package.__doc__ = "The overlay folder as vllm_ascend: the fast tier imports our modules from source."
    sys.modules[PACKAGE] = package
    os.environ[TARGET_ENV] = NO_ASSEMBLED_TREE


def overlay_package() -> types.ModuleType | None:
    """The ``vllm_ascend`` that ``enter_fast_tier`` made, if this process is in the fast tier."""
    package = sys.modules.get(PACKAGE)
    locations = getattr(getattr(package, "__spec__", None), "submodule_search_locations", None) or []
    return package if [str(OVERLAY_DIR)] == list(locations) else None
