"""A saved ``ds-bench --out`` file, read back for ``--from-json``: its shape is checked before the tables read it.

The file is untrusted input: valid JSON of another shape (a list, a number where the plan
goes, a rank without its records) is refused with a ``ValueError`` that says what is wrong,
instead of a ``TypeError`` from deep inside the tables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import cases as bench_cases

TOP = {"plan": dict, "ranks": list, "load_before": list, "load_after": list, "seconds": float}
PLAN = {"cases": list, "presets": list, "reference": str, "repeats": int}
RANK = {"presets": dict, "gate": dict, "modes": dict, "records": list, "max_rel_diff": float}
KINDS = {dict: "an object", list: "a list", str: "a string", int: "a whole number", float: "a number"}


def load(path: Path) -> dict:
    """The saved result at ``path``; ``OSError`` if it cannot be read, ``ValueError`` naming what is wrong."""
    data = json.loads(path.read_text())
    problems = shape_problems(data)
    if problems:
        raise ValueError("; ".join(problems) + "; give a file ds-bench --out wrote")
    return data


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return next((name for kind, name in KINDS.items() if _is(value, kind)), type(value).__name__)


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)


def _fields(data: dict, wanted: dict[str, type], where: str) -> list[str]:
    problems = []
    for key, kind in wanted.items():
        if key not in data:
            problems.append(f"{where}{key} is missing")
        elif not _is(data[key], kind):
            problems.append(f"{where}{key} is {_kind(data[key])}, not {KINDS[kind]}")
    return problems


def shape_problems(data: Any) -> list[str]:
    """What the tables would trip on in ``data``, each naming the field (empty: the shape is right)."""
    if not isinstance(data, dict):
        return [f"the file holds {_kind(data)}, not an object with {', '.join(TOP)}"]
    problems = _fields(data, TOP, "")
    if problems:
        return problems
    plan, ranks = data["plan"], data["ranks"]
    problems = _fields(plan, PLAN, "plan.")
    for key in ("load_before", "load_after"):
        if len(data[key]) != 3 or not all(_is(v, float) for v in data[key]):
            problems.append(f"{key} must be the 3 load averages (1 / 5 / 15 min)")
    if not problems:
        unknown = [name for name in plan["cases"] if name not in bench_cases.BY_NAME]
        if unknown:
            problems.append(f"plan.cases names no case {unknown!r:.80}; known: {', '.join(bench_cases.BY_NAME)}")
        if not all(isinstance(name, str) for name in plan["presets"]):
            problems.append("plan.presets must be a list of link preset names")
    if not ranks:
        problems.append("ranks is empty")
    for i, rank in enumerate(ranks):
        if not isinstance(rank, dict):
            problems.append(f"ranks[{i}] is {_kind(rank)}, not an object")
            continue
        problems += _fields(rank, RANK, f"ranks[{i}].")
    if problems:
        return problems
    first = ranks[0]
    for preset in plan["presets"]:
        for key in ("presets", "gate"):
            if not isinstance(first[key].get(preset), dict):
                problems.append(f"ranks[0].{key} has no object for preset {preset!r:.40}")
    return problems
