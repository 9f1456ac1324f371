"""Write ``git am``-able mail series for upstream, one folder per feature.

Each feature's series holds its overlay files (new files as new-file diffs, replaced
files as modifications of upstream's) and its patches. The series of the features are
applied in the order of ``FEATURES`` (build, hooks, cpp, dual-stream);
``dist/upstream/ORDER`` says so for the reader.

Every commit must work, so a bisection never lands on a broken tree. The commits are
ordered, and where needed merged, by the imports between the changes (``commit_groups``):
a change comes no earlier than the changes it imports, and a replaced module comes no
earlier than the change to any upstream file of the series that imports it (upstream's
code would meet the replacement's new API; within one feature: another feature's change to
that file is not what adapts it). Changes that need each other form one commit. A change
that needs a change of a feature applied later is an error.
"""

from __future__ import annotations

import ast
import heapq
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .assemble import Assembly, apply_patch
from .atomic import publish_folder, remove_stale, scratch_dir
from .graphs import strongly_connected_parts
from .hunks import git_diff
from .imports import import_statements, missing_names, module_of, redefined_names
from .mail_text import Mail, render
from .paths import DIST_DIR
from .series import FEATURES, OverlayFile, Patch, SeriesError

UPSTREAM_DIR = DIST_DIR / "upstream"
DEFAULT_AUTHOR = "vllm-ascend patch set <patchset@localhost>"


def _docstring_summary(path: Path) -> tuple[str, str]:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except SyntaxError:
        doc = ""
    paras = [p.strip("\n").rstrip() for p in doc.split("\n\n") if p.strip()]  # (a formula keeps its indent)
    if not paras:
        return "", ""
    # The second paragraph says what the module does; one that does not end a sentence leads
    # into what follows it (a list after a colon, a formula), so that goes too: a body never
    # stops mid-thought.
    end = 2
    while end < len(paras) and not paras[end - 1].endswith((".", ".)", "!", "?")):
        end += 1
    return " ".join(paras[0].split()), "\n\n".join(paras[1:end])


def overlay_mail(entry: OverlayFile, assembly: Assembly, date: str) -> Mail:
    new = entry.source.read_text().splitlines(keepends=True)
    old = (assembly.pristine / entry.repo_path).read_text().splitlines(keepends=True) if entry.replaces else []
    summary, more = _docstring_summary(entry.source)
    verb = "Replace" if entry.replaces else "Add"
    subject = f"{verb} {entry.repo_path}"
    body = "\n\n".join(p for p in (summary, more) if p)
    slug = entry.relpath.replace("/", "-").removesuffix(".py")
    return Mail(
        entry.feature,
        subject,
        body,
        DEFAULT_AUTHOR,
        date,
        git_diff(old, new, entry.repo_path, not entry.replaces),
        slug,
    )


def patch_mail(patch: Patch) -> Mail:
    slug = patch.name.removesuffix(".patch").split("-", 1)[-1]
    date = patch.header.get("Last-Update", "").strip() or "2026-01-01"
    return Mail(patch.feature, patch.subject, patch.body, patch.header["Author"].strip(), date, patch.diff, slug)


@dataclass(frozen=True)
class Change:
    """One overlay file or one patch: a candidate commit, with its files' text before and after it."""

    name: str  # overlay path or patch file name, for messages
    feature: str
    overlay: bool  # an overlay file: the module is new or rewritten as a whole
    before: dict[str, str | None]  # repo path -> text before the change (None: a new file)
    after: dict[str, str]
    mail: Mail


def forwarded(patch: Patch) -> bool:
    """Whether a patch goes upstream: not one whose header says ``Forwarded: not-needed``."""
    return patch.header.get("Forwarded", "").strip() != "not-needed"


def left_out(assembly: Assembly) -> set[str]:
    """Repo paths only the patch set's own changes touch (``Forwarded: not-needed`` patches and
    ``not-forwarded`` overlay files): the mails leave them as upstream has them.

    A file that one of those and a forwarded patch both change would leave the mails' tree
    neither upstream's nor ours, so that is an error."""
    own = {e.repo_path for e in assembly.overlay if not e.forwarded}
    own |= {f for p in assembly.patches if not forwarded(p) for f in p.files}
    shared = own & {f for p in assembly.patches if forwarded(p) for f in p.files}
    if shared:
        raise SeriesError(
            f"{', '.join(sorted(shared))}: changed by a forwarded patch and by the patch set's own "
            "(Forwarded: not-needed or not-forwarded); move the change to one side"
        )
    return own


def _changes(assembly: Assembly, date: str) -> list[Change]:
    """The forwarded overlay files, then the forwarded patches in series order, each patch seeing
    the files as the patches before it left them."""
    own = left_out(assembly)
    out = [
        Change(
            e.relpath,
            e.feature,
            True,
            {e.repo_path: _read(assembly.pristine / e.repo_path) if e.replaces else None},
            {e.repo_path: e.source.read_text()},
            overlay_mail(e, assembly, date),
        )
        for e in assembly.overlay
        if e.repo_path not in own
    ]
    current: dict[str, str | None] = {}
    for patch in assembly.patches:
        if not forwarded(patch):
            continue
        before = {f: current[f] if f in current else _read(assembly.pristine / f) for f in patch.files}
        with tempfile.TemporaryDirectory(prefix="diffs-") as tmp:
            for path, text in before.items():
                if text is not None:
                    (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                    (Path(tmp) / path).write_text(text)
            apply_patch(patch, Path(tmp))
            after = {f: (Path(tmp) / f).read_text() for f in patch.files}
        current.update(after)
        out.append(Change(patch.name, patch.feature, False, before, after, patch_mail(patch)))
    return out


def _read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def _needs(changes: Sequence[Change], assembly: Assembly) -> dict[int, set[int]]:
    """Change index -> indices of the changes it must not precede (the rules in the module doc)."""
    owners: dict[str, list[tuple[int, str]]] = {}
    for i, change in enumerate(changes):
        for path in change.after:
            owners.setdefault(module_of(path) or path, []).append((i, path))
    rank = {feature: n for n, feature in enumerate(FEATURES)}
    needs: dict[int, set[int]] = {i: set() for i in range(len(changes))}

    def is_module(dotted: str) -> bool:
        path = assembly.root / dotted.replace(".", "/")
        return dotted in owners or path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    def owners_of(target: str, names: tuple[str, ...]) -> list[tuple[int, str]]:
        # ``from package import submodule`` needs the submodule, not what changed the package's __init__.
        needs_target = not names or not all(is_module(f"{target}.{n}") for n in names)
        modules = ((target,) if needs_target else ()) + tuple(f"{target}.{n}" for n in names)
        return [owner for t in modules for owner in owners.get(t, ())]

    for i, change in enumerate(changes):
        for path, new in change.after.items():
            old = change.before[path]
            old_imports = import_statements(old, path) if old is not None else set()
            for target, names in import_statements(new, path):
                if (target, names) in old_imports and not change.overlay:
                    continue  # an import the file had before this patch, which leaves it as it was
                for j, module_path in owners_of(target, names):
                    if j == i or ((target, names) in old_imports and not changes[j].overlay):
                        continue  # an import this file already had, of a module a patch changes: same API
                    other, patch = changes[j].feature != change.feature, not changes[j].overlay
                    if rank[changes[j].feature] > rank[change.feature] or (other and patch and names):
                        # Another feature's change to a module is needed only for the names it adds (a
                        # later feature's), or adds or redefines (a patch, of an earlier one too).
                        before = changes[j].before[module_path]
                        package_dir = assembly.root / module_path.removesuffix("__init__.py")
                        if before is not None and not missing_names(before, package_dir, names):
                            if not patch or not set(names) & redefined_names(before, changes[j].after[module_path]):
                                continue
                    needs[i].add(j)  # this change uses what change j adds
            upstream = _read(assembly.pristine / path)
            for target, names in old_imports & (import_statements(upstream, path) if upstream else set()):
                for j, module_path in owners_of(target, names):
                    package_dir = assembly.root / module_path.removesuffix("__init__.py")
                    removed = missing_names(changes[j].after[module_path], package_dir, names)
                    if j != i and changes[j].feature == change.feature and (changes[j].overlay or removed):
                        needs[j].add(i)  # change j would break this file's upstream code: not before it
    for i, wanted in needs.items():
        for j in sorted(wanted):
            if rank[changes[j].feature] > rank[changes[i].feature]:
                raise SeriesError(
                    f"{changes[i].name} ({changes[i].feature}) needs {changes[j].name} ({changes[j].feature}), whose "
                    f"series is applied later (order: {', '.join(FEATURES)}); move one of them to the other feature"
                )
    return needs


def commit_groups(needs: dict[int, set[int]]) -> list[list[int]]:
    """Changes grouped into commits: the strongly connected parts of ``needs`` (changes that need
    each other land together), in an order that puts every change after what it needs, and
    otherwise keeps the given order."""
    groups = strongly_connected_parts(needs)
    group_of = {v: g for g, members in enumerate(groups) for v in members}
    waits = {g: {group_of[w] for v in members for w in needs[v]} - {g} for g, members in enumerate(groups)}
    ready = [(members[0], g) for g, members in enumerate(groups) if not waits[g]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, g = heapq.heappop(ready)
        ordered.append(groups[g])
        for h, wanted in waits.items():
            if g in wanted:
                wanted.discard(g)
                if not wanted:
                    heapq.heappush(ready, (groups[h][0], h))
    return ordered


def _merge(changes: Sequence[Change]) -> Mail:
    """One commit of changes that need each other."""
    mails = [c.mail for c in changes]
    if len(mails) == 1:
        return mails[0]
    modules: dict[str, list[str]] = {"replace": [], "add": []}
    for change in changes:
        if change.overlay:
            path = next(iter(change.after))
            verb = "replace" if change.before[path] is not None else "add"
            modules[verb].append(path.rsplit("/", 1)[-1].removesuffix(".py"))
    parts = [f"{verb} {_and(names)}" for verb, names in modules.items() if names]
    # The purpose is the patch's (the hook the modules serve); without one, or when upstream
    # modules are replaced (a reviewer must see that upstream code is rewritten), the modules are.
    patched = [c.mail.subject for c in changes if not c.overlay]
    by_modules = not patched or bool(modules["replace"])
    subject = "; ".join(parts) if by_modules else patched[0]
    subject = subject[:1].upper() + subject[1:]
    listed = parts + [s[:1].lower() + s[1:] for s in (patched if by_modules else patched[1:])]
    intro = (
        "One commit, since each of these needs another (an import, or upstream code a replaced module"
        " would break): " + "; ".join(listed) + "."
    )
    body = "\n\n".join([intro] + [f"{m.subject}." + (f" {m.body}" if m.body else "") for m in mails])
    first = mails[0]
    diff = "".join(m.diff for m in mails)
    slug = f"{first.slug}-and-{len(mails) - 1}-more"
    return Mail(first.feature, subject, body, first.author, max(m.date for m in mails), diff, slug)


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def series_by_feature(assembly: Assembly, source_patches: Sequence[Patch] = ()) -> dict[str, list[Mail]]:
    return _series(assembly, source_patches)[0]


def series_needs(assembly: Assembly) -> dict[str, dict[str, set[int]]]:
    """Per feature, what it needs of earlier features' series: feature -> numbers of their mails, from 1."""
    return _series(assembly)[1]


def _series(
    assembly: Assembly, source_patches: Sequence[Patch] = ()
) -> tuple[dict[str, list[Mail]], dict[str, dict[str, set[int]]]]:
    """The mails per feature, and per feature what it needs of earlier features' series
    (feature -> earlier feature -> numbers of the mails in that series, from 1). ``source_patches``
    (patches to upstream's tests and docs, ``upstream_ut.py``) close their feature's series: they
    test and document the code of every mail before them."""
    last_update = max((p.header.get("Last-Update", "") for p in assembly.patches), default="") or "2026-01-01"
    changes = _changes(assembly, last_update)
    needs = _needs(changes, assembly)
    out: dict[str, list[Mail]] = {}
    mail_number: dict[int, int] = {}  # change -> its mail's number in its feature's series
    earlier: dict[str, dict[str, set[int]]] = {}
    for feature in FEATURES:
        members = [i for i, c in enumerate(changes) if c.feature == feature]
        local = {i: {j for j in needs[i] if changes[j].feature == feature} for i in members}
        groups = commit_groups(local)
        mail_number.update({i: n for n, group in enumerate(groups, 1) for i in group})
        mails = [_merge([changes[i] for i in group]) for group in groups]
        mails += [patch_mail(p) for p in source_patches if p.feature == feature and forwarded(p)]
        if mails:
            out[feature] = mails
        for j in {j for i in members for j in needs[i] if changes[j].feature != feature}:
            earlier.setdefault(feature, {}).setdefault(changes[j].feature, set()).add(mail_number[j])
    return out, earlier


def write_diffs(
    assembly: Assembly,
    out_dir: Path = UPSTREAM_DIR,
    upstream: str = "vllm-ascend at the pinned tag",
    author: str | None = None,
    source_patches: Sequence[Patch] = (),
) -> dict[str, list[Path]]:
    """The mails under ``out_dir/<feature>/`` and ``out_dir/ORDER``; ``upstream`` names what they apply to;
    ``author`` ("Name <mail>"), when given, is every mail's author instead of the patches' headers';
    ``source_patches`` close their features' series (``_series``)."""
    if author is not None and not re.fullmatch(r"[^<>\n]+ <[^<>\s]+@[^<>\s]+>", author.strip()):
        raise SeriesError(f"AUTHOR={author!r}: give it as 'Full Name <name@example.com>'")
    series, earlier = _series(assembly, source_patches)
    # Written in a scratch folder, then renamed into place: an interrupted run leaves the last series whole.
    prefix = f".{out_dir.name}.tmp-"  # (".upstream-" would take ".upstream-main-..." for its own)
    remove_stale(out_dir.parent, prefix)
    tmp = scratch_dir(out_dir.parent, prefix)
    written: dict[str, list[Path]] = {}
    try:
        for feature, mails in series.items():
            (tmp / feature).mkdir()
            for n, mail in enumerate(mails, 1):
                if author is not None:
                    mail = replace(mail, author=author.strip())
                name = f"{n:04d}-{mail.slug}.patch"
                (tmp / feature / name).write_text(render(mail, n, len(mails)))
                written.setdefault(feature, []).append(out_dir / feature / name)
        _write_order(tmp, written, earlier, upstream)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_folder(tmp, out_dir)
    return written


def _names(paths: list[Path], numbers: set[int]) -> str:
    return ", ".join(paths[n - 1].name for n in sorted(numbers))


def _write_order(folder: Path, written: dict[str, list[Path]], earlier: dict, upstream: str) -> None:
    """``folder/ORDER``: the order to apply the series in, and which need an earlier one."""
    needed = []
    for f in (f for f in written if earlier.get(f)):
        order = sorted(earlier[f].items(), key=lambda item: FEATURES.index(item[0]))
        needed.append(f"{f} needs {_and([f'{g} ({_names(written[g], numbers)})' for g, numbers in order])}\n")
    (folder / "ORDER").write_text(
        f"Apply the series in this order on {upstream}, with git am --signoff DIR/*.patch:\n"
        + "".join(f"{f}\n" for f in written)
        + ("\nA series alone does not work where it needs an earlier one:\n" + "".join(needed) if needed else "")
    )
