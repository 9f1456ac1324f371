"""Replay the upstream mail series commit by commit; report what does not import at each commit.

    python replay_series.py REPO RESULT.json SERIES_DIR...    (or ``replay`` in a forked child)

REPO is a git repository whose HEAD is the pristine upstream tree. The patches of the
SERIES_DIRs are applied in order with ``git am``. After each commit, in this one process
(vLLM is imported once, or inherited from the process it was forked from; ``vllm_ascend``
is dropped from ``sys.modules`` between commits):

- every module the series has touched so far and the commit may affect (it or a module it
  imports, at any depth, changed) is imported;
- every import of a module the series changes, in a touched file or of a touched module,
  is resolved: the module imports and has the names (``imports.import_statements``: any
  depth, relative ones resolved, object paths in strings).

An upstream package whose ``__init__`` cannot run on a CPU (NPU-only code) stays a
package without that code, so its submodules are still checked. After the last commit everything is
checked once more: what fails there too is a limit of the CPU environment, not of the
order. RESULT.json holds, per commit, the series, subject, files and problems, and the
problems of that final full check.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vllm_ascend_patchset import imports
from vllm_ascend_patchset.imports import PACKAGE, import_statements, module_of

FULL_TIER = "the replay imports vLLM and every commit's modules in a process of its own"  # tiers.py


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


Statements = dict[str, set[tuple[str, tuple[str, ...]]]]  # module -> its imports (``import_statements``)


def tree_statements(tree: Path) -> Statements:
    """The imports of every module of an upstream tree, cached next to it: the tree never changes, and
    parsing its few hundred files is most of a replay's work. The cache is keyed by the parser's source."""
    version = hashlib.sha256(Path(imports.__file__).read_bytes()).hexdigest()[:12]
    cache = tree.with_name(f"{tree.name}.imports-{version}.json")
    if cache.is_file():
        data = json.loads(cache.read_text())
        return {m: {(t, tuple(names)) for t, names in entries} for m, entries in data.items()}
    out = {}
    for path in (tree / PACKAGE).rglob("*.py"):
        rel = path.relative_to(tree).as_posix()
        out[module_of(rel)] = import_statements(path.read_text(errors="replace"), rel)
    for old in tree.parent.glob(f"{tree.name}.imports-*.json"):
        old.unlink(missing_ok=True)
    part = cache.with_name(f"{cache.name}.{os.getpid()}")
    part.write_text(json.dumps({m: sorted(entries) for m, entries in out.items()}))
    os.replace(part, cache)
    return out


class Checker:
    def __init__(self, repo: Path, series_modules: set[str], statements: Statements) -> None:
        self.repo = repo
        self.series_modules = series_modules
        self.statements = {m: set(entries) for m, entries in statements.items()}
        self.touched: set[str] = set()

    def parse(self, repo_path: str) -> None:
        module = module_of(repo_path)
        path = self.repo / repo_path
        if module:
            self.statements[module] = import_statements(path.read_text(), repo_path) if path.exists() else set()

    def affected(self, changed: set[str]) -> set[str]:
        """``changed`` and every module that imports one of them, at any depth."""
        importers: dict[str, set[str]] = {}
        for module, statements in self.statements.items():
            for target, names in statements:
                for t in (target, *(f"{target}.{n}" for n in names)):
                    importers.setdefault(t, set()).add(module)
        out, todo = set(), list(changed)
        while todo:
            module = todo.pop()
            if module not in out:
                out.add(module)
                todo += importers.get(module, ())
        return out

    def _import(self, module: str) -> str | None:
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - any failure is the finding
            return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return None

    def _has(self, module: str, name: str) -> bool:
        if hasattr(sys.modules[module], name):
            return True
        base = self.repo.joinpath(*module.split("."), name)
        return base.with_suffix(".py").exists() or (base / "__init__.py").exists()

    def check(self, affected: set[str]) -> list[str]:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        errors = {m: self._import(m) for m in sorted(self.touched & affected)}
        problems = [f"import {m}: {e}" for m, e in errors.items() if e]
        for module in sorted(self.statements):
            for target, names in sorted(self.statements[module]):
                if target not in self.series_modules or not ({module, target} & self.touched):
                    continue
                if not ({module, target} & affected):
                    continue
                if target not in errors:
                    errors[target] = self._import(target)
                if errors[target]:
                    problems.append(f"{module}: import {target}: {errors[target]}")
                else:
                    problems += [
                        f"{module}: from {target} import {n}: no such name" for n in names if not self._has(target, n)
                    ]
        return sorted(set(problems))


class TolerantPackages(importlib.abc.MetaPathFinder):
    """An upstream package the series does not touch whose ``__init__`` fails on a CPU (NPU-only
    code) stays importable as a package: its submodules are what the check is about."""

    def __init__(self, touched: set[str]) -> None:
        self.touched = touched

    def find_spec(self, name, path, target=None):
        if not name.startswith(PACKAGE + ".") or name in self.touched:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.submodule_search_locations is None:
            return None
        spec.loader = _Tolerant(spec.loader)
        return spec


class _Tolerant(importlib.abc.Loader):
    def __init__(self, loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - the package stays, its failing __init__ code does not
            pass


def replay(repo: Path, result: Path, series: list[Path], upstream: Path | None = None) -> None:
    """Replay and write RESULT.json; meant for a process of its own (it changes sys.path and sys.modules).

    ``upstream``: the tree REPO's first commit holds (for its cached imports); default REPO itself.
    """
    os.environ["VLLM_PLUGINS"] = ""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    sys.dont_write_bytecode = True  # git am may rewrite a file within the same second: no stale .pyc
    sys.path.insert(0, str(repo))
    import npu_stubs

    npu_stubs.install()
    started = time.perf_counter()
    import vllm  # noqa: F401  (once, for every commit)

    print(f"vllm imported in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    patches = [patch for folder in series for patch in sorted(folder.glob("*.patch"))]
    files = [
        line[len("+++ b/") :].strip()
        for p in patches
        for line in p.read_text().splitlines()
        if line.startswith("+++ b/")
    ]
    checker = Checker(repo, {m for m in map(module_of, files) if m}, tree_statements(upstream or repo))
    sys.meta_path.insert(0, TolerantPackages(checker.touched))
    commits = []
    for patch in patches:
        _git(repo, "am", "-q", str(patch))
        changed_files = _git(repo, "diff", "--name-only", "HEAD~1", "HEAD").split()
        for path in changed_files:
            checker.parse(path)
        changed = {m for m in map(module_of, changed_files) if m}
        checker.touched |= changed
        problems = checker.check(checker.affected(changed))
        subject = _git(repo, "log", "-1", "--format=%s").strip()
        commits.append({"series": patch.parent.name, "subject": subject, "files": changed_files, "problems": problems})
        print(f"{time.perf_counter() - started:.1f} s: {subject}", file=sys.stderr)
    final = checker.check(set(checker.statements))
    result.write_text(json.dumps({"commits": commits, "final_problems": final}, indent=1))


if __name__ == "__main__":
    replay(Path(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
