"""The tooling and the overlay stay easy to read: no import circles, no private name used across modules,
small modules.

Imports are read from source at any depth (an import inside a function is as much a
dependency as one at the top), so a circle cannot hide behind a lazy import. The circle
check covers every Python file of the repository: the tooling package, the overlay
(imported as ``vllm_ascend.*``), and the scripts and tests, each imported by its file name
from its own folder.
"""

from __future__ import annotations

from pathlib import Path

from source_imports import Import, imports_of, module_name
from vllm_ascend_patchset.graphs import strongly_connected_parts
from vllm_ascend_patchset.paths import OVERLAY_DIR, PACKAGE, ROOT, SCRIPTS_DIR, TESTS_DIR

TOOLING = "vllm_ascend_patchset"
MAX_MODULE_LINES = 400


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def tooling_modules() -> dict[str, Path]:
    """Module name -> file of every module of the tooling package."""
    return {module_name(p, SCRIPTS_DIR): p for p in _python_files(SCRIPTS_DIR / TOOLING)}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports (``from M import sub`` counts ``M.sub``)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for imp in imports_of(path, name):
            for target in (imp.module, *(f"{imp.module}.{n}" for n in imp.names)):
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of more than one module."""
    return [part for part in strongly_connected_parts(graph) if len(part) > 1]


def test_the_circle_finder_finds_a_circle_through_a_lazy_import_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert strongly_connected_parts({"a": {"b"}, "b": set(), "c": {"a"}}) == [["b"], ["a"], ["c"]], "needs first"


def test_no_import_circle_among_the_tooling_modules():
    graph = import_graph(tooling_modules())
    assert sum(map(len, graph.values())) > 50, "the graph was read"
    assert circles(graph) == [], "an import circle: move what both need into a module of its own"


def repo_modules() -> dict[str, Path]:
    """Every module of the repository by the name it is imported as (a script or test by its file name)."""
    modules = _our_module_files()
    for folder in (SCRIPTS_DIR, TESTS_DIR):
        for path in _python_files(folder):
            if not path.is_relative_to(SCRIPTS_DIR / TOOLING) and path.name != "conftest.py":
                modules.setdefault(path.stem, path)
    return modules


def test_no_import_circle_anywhere_in_the_repository():
    """The overlay too: a lazy import inside a function (e.g. a method reaching the planner) closes a circle."""
    modules = repo_modules()
    graph = import_graph(modules)
    overlay = {name for name in graph if name.startswith(f"{PACKAGE}.")}
    assert len(overlay) > 20 and sum(len(graph[name]) for name in overlay) > 30, "the overlay's imports were read"
    assert circles(graph) == [], "an import circle: move what both need into a module of its own"


def _our_module_files() -> dict[str, Path]:
    """Our modules by import name: the tooling's and the overlay's (``vllm_ascend.*``)."""
    ours = tooling_modules()
    for path in _python_files(OVERLAY_DIR):
        ours[f"{PACKAGE}.{module_name(path, OVERLAY_DIR)}"] = path
    return ours


def private_imports(path: Path, name: str, ours: dict[str, Path]) -> list[str]:
    """``from M import _x`` (and ``import M._x``) in ``path`` where M is one of our modules other than itself."""
    found = []
    for imp in imports_of(path, name):
        private = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
        if imp.module in ours and imp.module != name and private:
            found.append(_where(path, imp, f"from {imp.module} import {', '.join(private)}"))
        parts = imp.module.split(".")
        if not imp.names and any(p.startswith("_") and not p.startswith("__") for p in parts) and parts[0] == TOOLING:
            found.append(_where(path, imp, f"import {imp.module}"))
    return found


def _where(path: Path, imp: Import, what: str) -> str:
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return f"{shown}:{imp.line}: {what}"


def test_the_private_import_finder_sees_a_relative_and_an_absolute_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from .diffs import _diff_lines, write\n"
        "def f():\n    from vllm_ascend_patchset.pin import _download\n"
        "from vllm_ascend_patchset.pin import __doc__\n"
    )
    ours = {"vllm_ascend_patchset.diffs": module, "vllm_ascend_patchset.pin": module}
    found = private_imports(module, "vllm_ascend_patchset.x", ours)
    assert [line.split(": ", 1)[1] for line in found] == [
        "from vllm_ascend_patchset.diffs import _diff_lines",
        "from vllm_ascend_patchset.pin import _download",
    ]


def test_no_private_name_of_our_modules_is_imported_by_another_module():
    """A leading underscore says "only this module uses it": one that another module needs is public."""
    ours = _our_module_files()
    found = []
    for folder, root in ((SCRIPTS_DIR, SCRIPTS_DIR), (TESTS_DIR, TESTS_DIR), (OVERLAY_DIR, OVERLAY_DIR)):
        for path in _python_files(folder):
            name = module_name(path, root)
            if folder == OVERLAY_DIR:
                name = f"{PACKAGE}.{name}"
            found += private_imports(path, name, ours)
    assert found == []


def test_every_module_of_scripts_and_the_overlay_is_at_most_400_lines():
    modules = _python_files(SCRIPTS_DIR) + _python_files(OVERLAY_DIR)
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules}
    assert len(sizes) > 50 and max(sizes.values()) > 200, "the modules were read"
    too_long = {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert too_long == {}, "split each by the concepts it holds, one module each"
