"""One wave of the twin's real workers for every test module that needs them.

A worker imports vLLM and a vllm_ascend tree before it runs anything, which costs far
more than the small cases the tests run. So the test modules register their cases when
they are imported (``add``, or ``add_command`` for a cpp-twin command line), and the
first module that asks for results (``results``) runs all of them in one
``run_cases``: one worker per tree for the whole session, as ``make bench`` does.

A command line is run twice in-process around the wave: once to capture the cases it
builds (its workers are not started), then again with the wave's results for exactly
those cases, so the command's parsing, tables, JSON and exit status are all exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from vllm_ascend_patchset.twin import policies as pol

FULL_TIER = "runs the twin's workers, which import vLLM and the assembled tree"  # tiers.py: what it needs

Case = tuple[pol.Setup, list[pol.Policy]]
_REQUESTS: dict[str, list[Case]] = {}
_RESULTS: dict[str, list[list[dict[str, Any]]]] = {}


class _Captured(Exception):
    """Stops a command at its run_cases: the cases are what it would run."""


def add(name: str, cases: Sequence[Case]) -> None:
    """Run ``cases`` in the session's wave; ``results(name)`` gives their results, in order."""
    if name in _REQUESTS:
        raise ValueError(f"twin wave: {name!r} is registered twice")
    _REQUESTS[name] = list(cases)


def add_command(name: str, command: Callable[[list[str]], int], argv: list[str]) -> None:
    """The cases the cpp-twin ``command(argv)`` runs, captured without starting a worker."""
    captured: list[Case] = []

    def capture(cases: list[Case], log_dir=None):
        captured.extend(cases)
        raise _Captured

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pol, "run_cases", capture)
        try:
            command(argv)
        except _Captured:
            pass
    if not captured:
        raise ValueError(f"twin wave: {argv} ran no case (it failed before its workers: run it to see why)")
    add(name, captured)


def run_command(name: str, command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)`` with the wave's results for the cases registered by ``add_command(name, ...)``."""
    expected = [setup.case(policies) for setup, policies in _REQUESTS[name]]
    answers = results(name)  # before run_cases is replaced: the wave runs the real workers

    def answer(cases: list[Case], log_dir=None):
        asked = [setup.case(policies) for setup, policies in cases]
        assert asked == expected, f"the command built other cases than it did: {_first_difference(expected, asked)}"
        return answers

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pol, "run_cases", answer)
        return command(argv)


def results(name: str) -> list[list[dict[str, Any]]]:
    """The results of the cases registered as ``name``: every case not run yet runs, in one wave, when one is asked."""
    if name not in _RESULTS:
        pending = [n for n in _REQUESTS if n not in _RESULTS]
        done = iter(pol.run_cases([case for n in pending for case in _REQUESTS[n]]))
        for n in pending:
            _RESULTS[n] = [next(done) for _ in _REQUESTS[n]]
    return _RESULTS[name]


def _first_difference(expected: Any, got: Any, where: str = "cases") -> str:
    """Where two JSON-like values first differ, and how."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got), key=str):
            if expected.get(key) != got.get(key):
                return _first_difference(expected.get(key), got.get(key), f"{where}.{key}")
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{where}: {len(expected)} items then, {len(got)} now"
        for index, (a, b) in enumerate(zip(expected, got, strict=True)):  # the same length
            if a != b:
                return _first_difference(a, b, f"{where}[{index}]")
    return f"{where}: {expected!r:.200} then, {got!r:.200} now"
