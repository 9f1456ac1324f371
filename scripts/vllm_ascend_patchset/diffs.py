"""Write ``git am``-able mail series for upstream, one folder per feature.

Each feature's series holds its overlay files (new files as new-file diffs, replaced
files as modifications of upstream's) followed by its patches in series order. The
series of the features are meant to be applied in the order of ``FEATURES`` (build,
hooks, cpp, dual-stream); ``dist/upstream/ORDER`` says so for the reader.
"""

from __future__ import annotations

import ast
import difflib
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from pathlib import Path

from .assemble import Assembly
from .pin import ROOT
from .series import FEATURES, OverlayFile, Patch

UPSTREAM_DIR = ROOT / "dist" / "upstream"
DEFAULT_AUTHOR = "vllm-ascend patch set <patchset@localhost>"


@dataclass(frozen=True)
class Mail:
    feature: str
    subject: str
    body: str
    author: str
    date: str  # YYYY-MM-DD
    diff: str
    slug: str


def _diff_lines(old: list[str], new: list[str], path: str, created: bool) -> str:
    """A git-style unified diff, with 'No newline' markers where a file lacks one."""
    out = [f"diff --git a/{path} b/{path}\n"]
    if created:
        out += ["new file mode 100644\n", "--- /dev/null\n", f"+++ b/{path}\n"]
    else:
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    body = list(difflib.unified_diff(old, new, n=3))[2:]  # drop difflib's own ---/+++ lines
    for line in body:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _docstring_summary(path: Path) -> tuple[str, str]:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except SyntaxError:
        doc = ""
    paras = [p.strip() for p in doc.split("\n\n") if p.strip()]
    if not paras:
        return "", ""
    return " ".join(paras[0].split()), "\n\n".join(paras[1:2])


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
        _diff_lines(old, new, entry.repo_path, not entry.replaces),
        slug,
    )


def patch_mail(patch: Patch) -> Mail:
    slug = patch.name.removesuffix(".patch").split("-", 1)[-1]
    date = patch.header.get("Last-Update", "").strip() or "2026-01-01"
    return Mail(patch.feature, patch.subject, patch.body, patch.header["Author"].strip(), date, patch.diff, slug)


def _render(mail: Mail, n: int, total: int) -> str:
    when = datetime.strptime(mail.date, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    body = mail.body.strip()
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {mail.author}\n"
        f"Date: {format_datetime(when)}\n"
        f"Subject: [PATCH {n}/{total}] {mail.feature}: {mail.subject}\n\n"
        + (f"{body}\n\n" if body else "")
        + f"Signed-off-by: {mail.author}\n---\n{mail.diff}"
        + ("" if mail.diff.endswith("\n") else "\n")
        + "-- \nvllm-ascend patch set\n\n"
    )


def series_by_feature(assembly: Assembly) -> dict[str, list[Mail]]:
    last_update = max((p.header.get("Last-Update", "") for p in assembly.patches), default="") or "2026-01-01"
    out: dict[str, list[Mail]] = {}
    for feature in FEATURES:
        mails = [overlay_mail(e, assembly, last_update) for e in assembly.overlay if e.feature == feature]
        mails += [patch_mail(p) for p in assembly.patches if p.feature == feature]
        if mails:
            out[feature] = mails
    return out


def write_diffs(assembly: Assembly, out_dir: Path = UPSTREAM_DIR) -> dict[str, list[Path]]:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    written: dict[str, list[Path]] = {}
    for feature, mails in series_by_feature(assembly).items():
        folder = out_dir / feature
        folder.mkdir(parents=True)
        for n, mail in enumerate(mails, 1):
            path = folder / f"{n:04d}-{mail.slug}.patch"
            path.write_text(_render(mail, n, len(mails)))
            written.setdefault(feature, []).append(path)
    (out_dir / "ORDER").write_text(
        "Apply the series in this order on vllm-ascend at the pinned tag (git am DIR/*.patch):\n"
        + "".join(f"{f}\n" for f in written)
    )
    return written
