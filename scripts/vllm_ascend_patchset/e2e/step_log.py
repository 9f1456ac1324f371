"""Every prefill step timed and logged, whatever the scheduler: how fast each server's engine ran.

The trace bench sets ``$CPP_E2E_STEP_LOG`` for every server it starts; the engine core
(``engine_hooks``) then wraps its scheduler class once it is built:

- ``schedule``: a step that carries a prefill chunk is marked for the CPU worker
  extension's clock (``cpp_time_step``, which the worker reads for any scheduler), and its
  batch, as ``(chunk_tokens, history_tokens)`` pairs, is kept until its output is back;
- ``update_from_output``: a marked step whose output carries ``execution_time_ms`` (the
  slowest stage's compute, what a profile sample holds) is logged, one line a step.

A mark is only ever added: a step the scheduler itself marks stays marked. Our scheduler
and upstream's CPP feed their own models only from the steps they marked themselves, so
the extra marks change no decision. The bench reads the lines back (``timed_steps``) and
the twin sets each policy's device pace from them (``twin_predict --steps``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

STEP_LOG_ENV = "CPP_E2E_STEP_LOG"
STEP_LINE = "[CPP e2e] timed step %s: %.2f ms"
STEP_RE = re.compile(r"\[CPP e2e\] timed step ([\d+,]+): ([\d.]+) ms")
MAX_KEPT = 64  # batches in flight whose output never came back are dropped past this


def batch_pairs(scheduler: Any, scheduler_output: Any) -> tuple[list[tuple[int, int]], bool]:
    """The step's (chunk_tokens, history_tokens) pairs and whether one of them is a prefill chunk.

    Called after ``schedule()``, which has already advanced each request's computed tokens
    by what it scheduled: the history is what was computed before this step.
    """
    pairs, prefill = [], False
    for req_id, tokens in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests.get(req_id)
        if request is None or tokens <= 0:
            continue
        history = request.num_computed_tokens - tokens
        pairs.append((int(tokens), int(history)))
        prefill = prefill or history < request.num_prompt_tokens
    return pairs, prefill


def format_pairs(pairs: list[tuple[int, int]]) -> str:
    return ",".join(f"{chunk}+{history}" for chunk, history in pairs)


def timed_steps(log: str) -> list[tuple[list[tuple[int, int]], float]]:
    """The logged steps of a server's log: (pairs, measured ms)."""
    steps = []
    for pairs, ms in STEP_RE.findall(log):
        batch = [(int(chunk), int(history)) for chunk, history in (pair.split("+") for pair in pairs.split(","))]
        steps.append((batch, float(ms)))
    return steps


def install(scheduler_cls: type, log: Any) -> bool:
    """Wrap ``scheduler_cls``'s step methods once (False if they already are); ``log(line, *args)`` writes."""
    if getattr(scheduler_cls.schedule, "_cpp_step_log", False):
        return False
    schedule, update_from_output = scheduler_cls.schedule, scheduler_cls.update_from_output
    kept: dict[int, tuple[Any, list[tuple[int, int]]]] = {}  # id -> (the output, kept alive: its id stays its own)

    @functools.wraps(schedule)
    def logged_schedule(self: Any, *args: Any, **kwargs: Any):
        output = schedule(self, *args, **kwargs)
        try:
            pairs, prefill = batch_pairs(self, output)
        except Exception:  # a bench aid: never in the engine's way
            return output
        if prefill:
            output.cpp_time_step = True
            kept[id(output)] = (output, pairs)
            if len(kept) > MAX_KEPT:
                del kept[next(iter(kept))]
        return output

    @functools.wraps(update_from_output)
    def logged_update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any, *args: Any, **kw: Any):
        entry = kept.pop(id(scheduler_output), None)
        measured_ms = getattr(model_runner_output, "execution_time_ms", None)
        if entry is not None and measured_ms:
            log(STEP_LINE, format_pairs(entry[1]), float(measured_ms))
        return update_from_output(self, scheduler_output, model_runner_output, *args, **kw)

    logged_schedule._cpp_step_log = True  # type: ignore[attr-defined]
    scheduler_cls.schedule = logged_schedule
    scheduler_cls.update_from_output = logged_update_from_output
    return True
