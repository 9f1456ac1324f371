"""One table per ``additional_config`` section: each key's default, range and meaning in one place.

A section (``profiling_chunk_config``, ``dual_stream_config``) is a frozen dataclass whose
fields are declared with ``setting(default, meaning, ...)``; the field name is the key.
``parse_section`` checks a user's dict against those fields, and the docs' tables are
rendered from the same metadata, so a key's default or meaning is one edit here.

Values are checked alike in every section:

- bool: ``true`` or ``false`` only (not 0 or 1, not a string);
- int: an integer, or a float with an integral value (``128.0`` is 128); not a bool;
- float: a finite number; not a bool;
- str: a string; with ``choices``, one of them;
- ``low`` / ``high`` bound ints and floats (``low_open`` makes the lower bound strict);
- ``nullable``: ``null`` is accepted as well (its meaning is in the key's meaning).

Every problem of a dict (unknown keys, wrong types, values out of range) is reported in
one error, one line each, as ``<section>.<key>=<value>: <fix>``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from typing import Any, TypeVar

SETTING = "setting"  # the field-metadata key holding a field's Setting

T = TypeVar("T")
_LARGEST_FLOAT = sys.float_info.max


@dataclass(frozen=True)
class Setting:
    """What one key accepts and means; the default is the dataclass field's."""

    kind: type  # bool, int, float or str
    meaning: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    default_from: str | None = None  # when absent, the key takes this other key's value

    def expects(self) -> str:
        """The accepted values in words, e.g. ``an integer in [8, 4096]``."""
        if self.kind is bool:
            text = "true or false"
        elif self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind is str:
            text = "a string"
        else:
            text = "an integer" if self.kind is int else "a number"
            low, high = _number_text(self.low), _number_text(self.high)
            if self.low is not None and self.high is not None:
                text += f" in {'(' if self.low_open else '['}{low}, {high}]"
            elif self.low is not None:
                text += f" {'>' if self.low_open else '>='} {low}"
            elif self.high is not None:
                text += f" <= {high}"
        return text + (", or null" if self.nullable else "")

    def check(self, value: Any) -> tuple[Any, str | None]:
        """``(value as its kind, None)``, or ``(value, what is wrong)``."""
        if value is None and self.nullable:
            return None, None
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.kind is str:
            ok = isinstance(value, str) and (not self.choices or value in self.choices)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            ok = False
        elif isinstance(value, float) and not math.isfinite(value):  # ints are exact at any size
            ok = False
        elif self.kind is int:
            ok = isinstance(value, int) or value.is_integer()
            value = int(value) if ok else value
        else:
            ok = abs(value) <= _LARGEST_FLOAT  # a JSON integer can be past every float
            value = float(value) if ok else value
        if ok and self.kind in (int, float):
            ok = self.low is None or (value > self.low if self.low_open else value >= self.low)
            ok = ok and (self.high is None or value <= self.high)
        return value, None if ok else f"must be {self.expects()}"


def setting(
    default: Any,
    meaning: str,
    *,
    kind: type | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: tuple[str, ...] = (),
    nullable: bool = False,
    default_from: str | None = None,
) -> Any:
    """A dataclass field for one key; ``kind`` defaults to the type of ``default``."""
    spec = Setting(kind or type(default), meaning, low, high, low_open, tuple(choices), nullable, default_from)
    return dataclasses.field(default=default, metadata={SETTING: spec})


def settings(section: type) -> dict[str, tuple[Any, Setting]]:
    """Key -> (default, Setting) for every field of ``section``, in declaration order."""
    return {f.name: (f.default, f.metadata[SETTING]) for f in dataclasses.fields(section) if SETTING in f.metadata}


def problem(key: str, name: str, value: Any, fix: str) -> str:
    """One problem line: ``<section>.<key>=<value>: <fix>``."""
    return f"{key}.{name}={value!r}: {fix}"


def raise_problems(key: str, problems: list[str], error: type[Exception] = ValueError, footer: str = "") -> None:
    """Raise ``error`` listing every problem, then ``footer`` (nothing when there is no problem)."""
    if not problems:
        return
    text = problems[0] if len(problems) == 1 else f"{key}: {len(problems)} problems:\n  " + "\n  ".join(problems)
    raise error(text + (f"\n{footer}" if footer else ""))


def parse_section(section: type[T], raw: Any, *, key: str, error: type[Exception] = ValueError) -> T:
    """``section`` built from the user's dict ``raw`` (None: all defaults); raises ``error`` on any problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f'{key}={raw!r}: must be a JSON object such as {{"enabled": true}}')
    table = settings(section)
    problems = [problem(key, name, raw[name], "not a known key") for name in raw if name not in table]
    footer = f"The keys of {key} are {', '.join(table)}." if problems else ""
    values: dict[str, Any] = {}
    for name, (default, spec) in table.items():
        if name not in raw:
            continue
        values[name], fault = spec.check(raw[name])
        if fault:
            problems.append(problem(key, name, raw[name], f"{fault} (default {_default_text(default, spec)})"))
    raise_problems(key, problems, error, footer)
    for name, (_default, spec) in table.items():
        if name not in values and spec.default_from is not None:
            values[name] = values.get(spec.default_from, table[spec.default_from][0])
    return section(**values)


def _default_text(default: Any, spec: Setting) -> str:
    """The default as the user writes it (JSON), or the key it follows."""
    return f"the value of {spec.default_from}" if spec.default_from else json.dumps(default)


def _number_text(number: float | None) -> str:
    if number is None:
        return ""
    return str(int(number)) if float(number).is_integer() else repr(number)
