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
- ``low`` / ``high`` bound ints and floats (``low_open`` makes the lower bound strict); an
  int key without ``high`` takes ``INT_CEILING``, so no key accepts an integer of any size;
- ``folder``: a string naming a folder, made absolute at parse time (``~`` expanded, a
  relative path taken from the working directory), under a folder this process can write;
  ``""`` passes unchanged;
- ``nullable``: ``null`` is accepted as well (its meaning is in the key's meaning).

A section that has an ``enabled`` key and is given other keys without it is off, as by
default: one warning says so (once per process), since the user who set them likely
meant it on.

Every problem of a dict (unknown keys, wrong types, values out of range) is reported in
one error, one line each, as ``<section>.<key>=<value>: <fix>``; a value too long to read
(an integer of thousands of digits, a long string) is shown shortened, and a key that
would not read as written (invisible characters, white space around it, too long) is
quoted with those characters escaped, naming the known key it is without them.

Every section is checked in ``AscendConfig.__init__``, each where its flags are known. So
that one restart fixes them all, the engine builds its AscendConfig within
``sections_refused_together``: a section refused meanwhile (``refuse``) is kept, and every
section's problems are raised in one error when the AscendConfig is built. Outside it,
``refuse`` raises at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import os
import reprlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from vllm_ascend.log_adapter import get_logger

logger = get_logger(__name__)

SETTING = "setting"  # the field-metadata key holding a field's Setting

T = TypeVar("T")
_LARGEST_FLOAT = sys.float_info.max
# The upper bound of an int key that declares none: every count the engine keeps (tokens, steps,
# requests) fits a signed 32-bit integer, so a value past it is a slip, never a setting.
INT_CEILING = 2**31 - 1
_gathering = threading.local()  # .errors: the sections refused within sections_refused_together, or None


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
    folder: bool = False  # a str that names a folder (see folder_path)

    def expects(self) -> str:
        """The accepted values in words, e.g. ``an integer in [8, 4096]``."""
        if self.kind is bool:
            text = "true or false"
        elif self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind is str:
            text = "a folder path" if self.folder else "a string"
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
        elif self.kind is str and self.folder and isinstance(value, str):
            return folder_path(value)
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
    folder: bool = False,
) -> Any:
    """A dataclass field for one key; ``kind`` defaults to the type of ``default``."""
    kind = kind or type(default)
    if kind is int and high is None:
        high = INT_CEILING
    spec = Setting(kind, meaning, low, high, low_open, tuple(choices), nullable, default_from, folder)
    return dataclasses.field(default=default, metadata={SETTING: spec})


def folder_path(value: str, writable: bool = True) -> tuple[str, str | None]:
    """``(the folder as an absolute path, None)``, or ``(value, what is wrong)``; ``""`` passes unchanged.

    ``~`` and ``~user`` are expanded and a relative path is taken from the working
    directory now, once: a path that cannot be expanded would otherwise become a folder
    named ``~...`` in whatever directory the server runs in. The nearest part of the path
    that exists must be a folder this process can write (a read-only file system is not),
    or saving into it fails after the work is done, and the work is done again next start.
    """
    if value == "":
        return value, None
    if "\x00" in value:
        return value, "must not contain a NUL byte: write the folder's path without it"
    if not value.strip():
        return value, "is only white space: write a folder path"
    if value != value.strip():
        return value, "must not start or end with white space: write the folder's path without it"
    expanded = os.path.expanduser(value)
    if expanded.startswith("~"):
        user = value[1:].split("/", 1)[0]
        if user:
            return value, (
                f"~{user} names no user on this host: write the folder as an absolute path, "
                "or begin it with ~/ for the user the server runs as"
            )
        return value, (
            f"~ cannot be expanded: HOME is not set and user id {os.getuid()} has no home in the password "
            "database; set HOME, or give an absolute path"
        )
    path = os.path.abspath(expanded)
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        return value, f"{existing} is not a folder: name a folder, or a path under one"
    if writable and not os.access(existing, os.W_OK | os.X_OK):  # (a read-only file system too)
        return value, f"{existing} is not writable here (user id {os.getuid()}): name a folder the server can write"
    return path, None


def _nearest_existing(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def unwritable_part(path: str) -> str | None:
    """The nearest existing part of ``path`` when this process cannot write there (a read-only file system
    too), else None."""
    existing = _nearest_existing(path)
    return None if os.access(existing, os.W_OK | os.X_OK) else existing


def settings(section: type) -> dict[str, tuple[Any, Setting]]:
    """Key -> (default, Setting) for every field of ``section``, in declaration order."""
    return {f.name: (f.default, f.metadata[SETTING]) for f in dataclasses.fields(section) if SETTING in f.metadata}


class _Shown(reprlib.Repr):
    """``repr`` cut to a readable length; an integer too long to read is described, not printed.

    ``repr`` of an integer past 4300 digits raises ValueError, so a problem line built with
    it would lose the key it is about.
    """

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80

    def repr_int(self, x: int, level: int) -> str:
        if abs(x) < 10**30:
            return repr(x)
        digits = round(x.bit_length() * math.log10(2))
        return f"<{'a negative' if x < 0 else 'an'} integer of about {digits} digits>"


def shown(value: Any) -> str:
    """``value`` as a problem line shows it: its repr, shortened when too long to read."""
    return _Shown().repr(value)


def problem(key: str, name: Any, value: Any, fix: str) -> str:
    """One problem line: ``<section>.<key>=<value>: <fix>``; a key that would not read as it is is quoted, escaped."""
    return f"{key}.{name if _plain(name) else shown(name)}={shown(value)}: {fix}"


def _plain(name: Any) -> bool:
    """A key a line can show as it is: a short string of visible characters, no white space around them."""
    return isinstance(name, str) and 0 < len(name) <= 80 and name.isprintable() and name == name.strip()


def _visible(name: str) -> str:
    """``name`` without what does not show: non-printable characters (zero-width ones, controls, other
    spaces than ' ') and white space around it."""
    return "".join(c for c in name if c.isprintable()).strip()


def _unknown_key(name: Any, known: dict) -> str:
    """The fix for an unknown key; names the known key it is once its invisible characters are gone, or the one
    it plainly slips from (another case, dashes, a near spelling)."""
    if isinstance(name, str) and name != _visible(name) and _visible(name) in known:
        return f"not a known key; did you mean {_visible(name)}? Delete the characters that do not show"
    if isinstance(name, str) and len(name) <= 80:
        near = difflib.get_close_matches(_visible(name).lower().replace("-", "_"), list(known), n=1, cutoff=0.85)
        if near:
            return f"not a known key; did you mean {near[0]}?"
    return "not a known key"


def raise_problems(key: str, problems: list[str], error: type[Exception] = ValueError, footer: str = "") -> None:
    """Raise ``error`` listing every problem, then ``footer`` (nothing when there is no problem)."""
    if not problems:
        return
    text = problems[0] if len(problems) == 1 else f"{key}: {len(problems)} problems:\n  " + "\n  ".join(problems)
    raise error(text + (f"\n{footer}" if footer else ""))


@contextlib.contextmanager
def sections_refused_together() -> Iterator[None]:
    """Around the engine's AscendConfig: the sections refused within are raised together at its end,
    in one error of the first's type (an error of the body itself propagates as it is)."""
    outer = getattr(_gathering, "errors", None)
    errors: list[Exception] = []
    _gathering.errors = errors
    try:
        yield
    finally:
        _gathering.errors = outer
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise type(errors[0])("\n".join(str(error) for error in errors))


def refuse(error: Exception) -> None:
    """Raise a section's error; within ``sections_refused_together``, keep it for its end."""
    errors = getattr(_gathering, "errors", None)
    if errors is None:
        raise error
    errors.append(error)


def check_section_name(additional_config: Any, key: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` when ``additional_config`` has no ``key`` but a key that is plainly a slip
    of it (its stem, another case or dashes, or a near spelling): the feature would stay off
    with no word."""
    if not isinstance(additional_config, dict) or key in additional_config:
        return
    stem = key.removesuffix("_config")
    squashed = {key.replace("_", ""), stem.replace("_", "")}  # DualStream, dualstream, profilingchunk
    for name in additional_config:
        if not isinstance(name, str):
            continue
        flat = _visible(name).lower().replace("-", "_")
        near = max(difflib.SequenceMatcher(None, flat, k).ratio() for k in (key, stem))
        if flat in (key, stem) or flat.replace("_", "") in squashed or near >= 0.85:
            raise error(f"additional_config key {shown(name)} is not read: did you mean {key!r}? Rename it.")


_WARNED_OFF: set[str] = set()  # sections whose keys were given without "enabled" (warned once)


def parse_section(
    section: type[T], raw: Any, *, key: str, error: type[Exception] = ValueError, replaced: dict[str, str] | None = None
) -> T:
    """``section`` built from the user's dict ``raw`` (None: all defaults); raises ``error`` on any problem.
    ``replaced``: keys no longer read, each with what replaced it (named as the fix)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise error(f'{key}={shown(raw)}: must be a JSON object such as {{"enabled": true}}')
    table = settings(section)
    fixes = {name: f"replaced by {why}" for name, why in (replaced or {}).items()}
    problems = [
        problem(key, name, raw[name], fixes.get(name) or _unknown_key(name, table)) for name in raw if name not in table
    ]
    footer = f"The keys of {key} are {', '.join(table)}." if problems else ""
    values: dict[str, Any] = {}
    for name, (default, spec) in table.items():
        if name not in raw:
            continue
        values[name], fault = spec.check(raw[name])
        if fault:
            problems.append(problem(key, name, raw[name], f"{fault} (default {_default_text(default, spec)})"))
    raise_problems(key, problems, error, footer)
    if raw and "enabled" in table and "enabled" not in raw and key not in _WARNED_OFF:
        _WARNED_OFF.add(key)  # (once per process: the engine parses its config more than once)
        logger.warning(
            '[PatchSet] %s sets %s but not "enabled", which is false by default: the feature stays off. '
            'Add "enabled": true to turn it on.', key, ", ".join(sorted(raw)),
        )  # fmt: skip
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
