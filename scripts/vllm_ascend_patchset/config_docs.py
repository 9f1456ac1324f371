"""The docs' tables of the config sections, rendered from the config dataclasses' fields.

Each key of ``profiling_chunk_config`` and ``dual_stream_config`` is declared once, as a
field of its dataclass (``vllm_ascend/config_table.py``); the table in the feature's doc
is that metadata, rendered here. ``vllm-ascend-patchset config-docs`` (``make
config-docs``) rewrites the tables after a key changes; the tests fail while one is stale.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from .paths import ROOT

# doc -> (module, dataclass) of the section it documents, imported from the assembled tree
SECTIONS = {
    "docs/cpp.md": ("vllm_ascend.core.cpp_config", "CppConfig"),
    "docs/dual-stream.md": ("vllm_ascend.dual_stream.config", "DualStreamConfig"),
}
HEADER = "| key | default | accepted values | meaning |"


def section_class(doc: str, assembled: Path | None = None) -> type:
    """The dataclass ``doc`` documents; ``assembled`` (build/<target>) goes on sys.path first."""
    if assembled is not None and str(assembled) not in sys.path:
        sys.path.insert(0, str(assembled))
    module, name = SECTIONS[doc]
    return getattr(importlib.import_module(module), name)


def render(section: type) -> list[str]:
    """The markdown table of ``section``: one row per key, in declaration order."""
    from vllm_ascend.config_table import settings

    rows = [HEADER, "| --- | --- | --- | --- |"]
    for key, (default, spec) in settings(section).items():
        shown = f"= `{spec.default_from}`" if spec.default_from else f"`{json.dumps(default)}`"
        rows.append(f"| `{key}` | {shown} | {spec.expects()} | {spec.meaning} |")
    return rows


def table_span(lines: list[str], doc: str) -> tuple[int, int]:
    """``[start, end)`` of the one table headed ``HEADER`` in ``lines``."""
    if lines.count(HEADER) != 1:
        raise ValueError(f"{doc} must hold exactly one table headed {HEADER!r}")
    start = end = lines.index(HEADER)
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def documented(doc: str, root: Path = ROOT) -> list[str]:
    lines = (root / doc).read_text().splitlines()
    start, end = table_span(lines, doc)
    return lines[start:end]


def write(doc: str, section: type, root: Path = ROOT) -> bool:
    """Rewrite ``doc``'s table from ``section``; True when it changed."""
    path = root / doc
    lines = path.read_text().splitlines()
    start, end = table_span(lines, doc)
    table = render(section)
    if lines[start:end] == table:
        return False
    lines[start:end] = table
    path.write_text("\n".join(lines) + "\n")
    return True
