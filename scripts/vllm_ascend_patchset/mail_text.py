"""A mail of a series as ``git format-patch`` writes it: the ``Mail`` and its text (``render``).

The body is wrapped to git's width for a commit message (paragraphs filled, list items under
their own indent, indented lines kept); ``git am`` reads the result.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime


@dataclass(frozen=True)
class Mail:
    feature: str
    subject: str
    body: str
    author: str
    date: str  # YYYY-MM-DD
    diff: str
    slug: str


BODY_WIDTH = 72  # git's convention for a commit message's body
ITEM = re.compile(r"(- |\d+\. )")  # a list item's marker


def _wrap(body: str) -> str:
    """The body in lines of at most ``BODY_WIDTH``: each paragraph filled, a list item (``- ``,
    ``1. ``) filled under its own indent; a paragraph of indented lines (a formula, code) kept as it is."""
    out = []
    for para in body.strip().split("\n\n"):
        lines = para.splitlines()
        if lines and all(line.startswith(" ") for line in lines):
            out.append(para)
            continue
        items: list[list[str]] = []
        for line in lines:
            stripped = line.strip()
            if ITEM.match(stripped) or not items:
                items.append([stripped])
            else:
                items[-1].append(stripped)
        filled = []
        for item in items:
            text = " ".join(item)
            marker = ITEM.match(text)
            indent = " " * len(marker.group(0)) if marker else ""
            filled.append(textwrap.fill(text, BODY_WIDTH, subsequent_indent=indent, break_on_hyphens=False))
        out.append("\n".join(filled))
    return "\n\n".join(out)


def render(mail: Mail, n: int, total: int) -> str:
    when = datetime.strptime(mail.date, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    body = _wrap(mail.body)
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {mail.author}\n"
        f"Date: {format_datetime(when)}\n"
        f"Subject: [PATCH {n}/{total}] {mail.feature}: {mail.subject}\n\n"
        + (f"{body}\n\n" if body else "")
        + f"---\n{mail.diff}"
        + ("" if mail.diff.endswith("\n") else "\n")
        + "-- \nvllm-ascend patch set\n\n"
    )
