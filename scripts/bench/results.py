"""The results pages: every measured figure of the docs in one place, rendered from saved bench outputs.

    python scripts/bench/results.py              # rewrite the pages from docs/results/*.json (seconds)
    python scripts/bench/results.py --check      # exit 1 if a page is not what the saved outputs render
    python scripts/bench/results.py --run twin-long,twin-traces   # run those benches anew, save, rewrite
    make results [RUN=name,...]                  # the same through the Makefile

The pages are docs/results.md (the twin, CPP's scheduling cost) and docs/results-engine.md
(vLLM's CPU engine, dual stream). Each source below is one bench and the command that
reproduces it. Its saved output, ``docs/results/<name>.json``, holds the command, the date
and commit it ran at (and whether the tree had uncommitted changes), the host, and the
output: the twin's ``--json`` figures (slimmed to the columns the page shows) or the tables
another bench printed. A wall-clock bench measured before the pages existed keeps the table
its run printed, as the docs quoted it ("recorded"), until ``--run`` measures it again. Only
the text between a source's markers, in whichever page holds them, is rewritten; the prose
around them is kept. ``--from-json DIR`` reads the saved outputs from another folder.

Bad input (an unknown source, a saved file that is not one, a source's markers missing or
twice) exits 2 naming it, before anything is written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import ROOT  # noqa: E402
from vllm_ascend_patchset.results_tables import (  # noqa: E402
    TRACE,
    render_closing,
    render_gate,
    render_long,
    render_mixed,
    render_pace,
    render_recorded,
    render_serving,
)

PAGES = (ROOT / "docs" / "results.md", ROOT / "docs" / "results-engine.md")  # the twin's; the CPU engine's
SAVED = ROOT / "docs" / "results"
TWIN = "PYTHONPATH=scripts .venv/bin/python -m vllm_ascend_patchset cpp-twin"
TRACE_SLICES = f"trace:{TRACE}@0:32,trace:{TRACE}@32:32,trace:{TRACE}@64:32"
SURFACES = {"cpu": "tests/data/cpu_surface.csv", "synthetic": "synthetic"}
ROW_KEYS = (
    "name", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms", "e2e_mean_ms",
    "e2e_p99_ms", "goodput", "num_chunks", "vs_optimum",
)  # fmt: skip
SIMULATED = "the twin's simulated time, which the host's speed and load do not change"


class ResultsError(Exception):
    """Bad input: the message names the source, file or marker and what to do."""


class BenchFailed(ResultsError):
    """A bench run by --run failed: nothing is saved."""


@dataclass(frozen=True)
class Source:
    name: str
    commands: tuple[str, ...]  # shell commands run from the checkout; {out} is a JSON file the twin writes
    render: Callable[[dict[str, Any]], list[str]]


def _twin(surface: str, args: str) -> str:
    return f"{TWIN} --surface {SURFACES[surface]} {args} --json {{out}}"


LONG = "--workload long:32k,long:128k,long:256k --stages 2,4,8"
MIXED = "--workload mixed --stages 4"
TRACES = f"--workload {TRACE_SLICES} --load 0.5,0.8,0.95 --stages 2,4 --sweep 256,4096"
TRACES_TTFT_FIRST = f"{TRACES} --policies tuned,ours --target-tpot-ms 1e6"  # CPP's TTFT-first setting
E2E_TRACE = f'make bench-e2e BENCH_E2E_ARGS="--trace {TRACE}@42:20 --load 0.8 --output-cap 64 --fixed-pick 2"'
E2E_TRACE_TARGET = (
    f'make bench-e2e BENCH_E2E_ARGS="--trace {TRACE}@42:20 --load 0.8 --output-cap 64 --fixed 128,256,512,1024'
    ' --fixed-pick 2 --policies fixed,ours --target-tpot-ms 400"'
)
PACE_SURFACES = "tests/data/cpu_surface.csv,tests/data/cpu_surface_deep.csv,tests/data/cpu_surface_wide.csv,synthetic"
PACE_TRACES = f"trace:{TRACE}@0:32,trace:{TRACE}@32:32,trace:tests/data/traces/azure_code.csv@0:32"
SOURCES = (
    Source("twin-long", (_twin("cpu", LONG), _twin("synthetic", LONG)), render_long),
    Source("twin-mixed", (_twin("cpu", MIXED), _twin("synthetic", MIXED)), render_serving),
    Source("twin-traces", (_twin("cpu", TRACES), _twin("synthetic", TRACES)), render_serving),
    Source("twin-traces-ttft-first", (_twin("cpu", TRACES_TTFT_FIRST), _twin("synthetic", TRACES_TTFT_FIRST)),
           render_serving),
    Source("cpp-mixed", (
        "PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_mixed.py --bases 2048,4096,8192",),
           render_mixed),
    Source("cpp-mixed-ttft-first", (
        "PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_mixed.py --bases 2048,4096,8192 --target-tpot-ms 1e6",),
           render_mixed),
    Source("cpp-surfaces", ("PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_surfaces.py",), render_gate),
    Source("cpp-sched-overhead", ("PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_sched_overhead.py",),
           render_closing("CPP's cost per step")),
    Source("e2e-prompt", (
        'make bench-e2e BENCH_E2E_ARGS="--fixed 256,512,1024,2048"',), render_recorded),
    Source("e2e-repeats", (
        'make bench-e2e BENCH_E2E_ARGS="--fixed 1024 --prompts 16384 --repeats 10 --policies fixed,ours"',
        'make bench-e2e BENCH_E2E_ARGS="--fixed 1024 --prompts 32768 --repeats 8 --policies fixed,ours"'),
           render_recorded),
    Source("e2e-trace", (E2E_TRACE,), render_recorded),
    Source("e2e-trace-target", (E2E_TRACE_TARGET,), render_recorded),
    Source("cpp-pace", (
        f"PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_pace.py --surfaces {PACE_SURFACES}",
        f"PYTHONPATH=scripts .venv/bin/python scripts/bench/cpp_pace.py --surfaces {SURFACES['cpu']},synthetic"
        f" --workloads {PACE_TRACES} --loads 0.8"), render_pace),
    Source("e2e-uneven", (
        "PYTHONPATH=scripts .cache/e2e/venv/bin/python -m vllm_ascend_patchset.e2e.run uneven --layers 3,1",),
           render_recorded),
    Source("ds-bench", ("make bench-ds",), render_recorded),
)  # fmt: skip
BY_NAME = {s.name: s for s in SOURCES}


def begin(name: str) -> str:
    return f"<!-- results:{name} (generated by scripts/bench/results.py; edit the prose outside) -->"


def end(name: str) -> str:
    return f"<!-- /results:{name} -->"


def section(source: Source, saved: dict[str, Any]) -> list[str]:
    shown = [c.replace("{out}", "FILE.json") for c in saved["commands"]]
    when = f"{saved['date']}, commit {saved['commit']}" + (" with uncommitted changes" if saved.get("dirty") else "")
    how = "recorded from the run's printed table" if saved.get("recorded") else "measured"
    lines = ["```", *shown, "```", f"{how.capitalize()} {when}; {saved['host']}.", ""]
    return [*lines, *source.render(saved)]


# ----------------------------------------------------------------------------- saved outputs and the page


def check(source: Source, saved: Any, path: Path) -> dict[str, Any]:
    """``saved`` if it is a saved output of ``source`` that renders; else an error naming ``path``."""
    try:
        if not isinstance(saved, dict) or saved.get("name") != source.name:
            raise ValueError("its name is not this source's")
        for key in ("commands", "date", "commit", "host", "output"):
            if key not in saved:
                raise ValueError(f"it lacks {key!r}")
        source.render(saved)
    except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError, AttributeError) as exc:
        why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ResultsError(f"{path}: not a saved output of {source.name} ({why}); run it again with --run") from None
    return saved


def load(folder: Path, skip: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Every source's saved output from ``folder`` but ``skip``; a missing or malformed file is an error naming it."""
    found = {}
    for source in SOURCES:
        if source.name in skip:
            continue
        path = folder / f"{source.name}.json"
        try:
            found[source.name] = check(source, json.loads(path.read_text()), path)
        except FileNotFoundError:
            raise ResultsError(f"{path}: missing; run: python scripts/bench/results.py --run {source.name}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            why = f"{path}: not a saved output of {source.name} ({exc}); run it again with --run"
            raise ResultsError(why) from None
    return found


def check_markers(texts: dict[Path, str]) -> None:
    """Each source's pair of markers, in order, in exactly one of the pages."""
    for source in SOURCES:
        head, tail = begin(source.name), end(source.name)
        holding = [p for p, t in texts.items() if head in t or tail in t]
        text = texts[holding[0]] if len(holding) == 1 else ""
        if text.count(head) != 1 or text.count(tail) != 1 or text.index(head) > text.index(tail):
            pages = " or ".join(str(p.relative_to(ROOT)) for p in texts)
            raise ResultsError(f"{pages}: needs one pair of markers for {source.name}, in order: {head} ... {tail}")


def rewrite(text: str, saved: dict[str, dict[str, Any]]) -> str:
    """``text`` (one page) with the span between each source's markers it holds rendered anew."""
    for source in SOURCES:
        if begin(source.name) not in text:
            continue
        before, rest = text.split(begin(source.name), 1)
        after = rest.split(end(source.name), 1)[1]
        body = "\n".join(section(source, saved[source.name]))
        text = f"{before}{begin(source.name)}\n{body}\n{end(source.name)}{after}"
    return text


def slim(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The twin's --json cases with the figures this page shows (the per-request lists stay in the run's file)."""
    out = []
    for case in cases:
        optimum = case.get("optimum")
        out.append({
            **{k: case.get(k) for k in ("surface", "workload", "stages", "requests", "slo")},
            "optimum": optimum and {**{k: optimum[k] for k in ("best_ms", "in_flight_ms", "certified")},
                                    "chunks": len(optimum["chunks"])},
            "rows": [{k: row.get(k) for k in ROW_KEYS} for row in case["rows"]],
        })  # fmt: skip
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def run(source: Source) -> dict[str, Any]:
    """Run ``source``'s commands in this checkout; its saved output (not yet written)."""
    twin = "{out}" in source.commands[0]
    stdout, cases = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for index, command in enumerate(source.commands):
            out = Path(scratch) / f"out{index}.json"
            print(f"results: {source.name}: {command}", file=sys.stderr)
            done = subprocess.run(command.replace("{out}", str(out)), shell=True, cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": "scripts"})  # fmt: skip
            if done.returncode != 0:
                raise BenchFailed(f"{source.name}: {command} exited {done.returncode}; nothing saved")
            stdout.append(done.stdout)
            cases += slim(json.loads(out.read_text())) if twin else []
    output = cases if twin else {"stdout": "".join(stdout)}
    return {
        "name": source.name,
        "commands": list(source.commands),
        "date": datetime.date.today().isoformat(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "host": SIMULATED
        if twin
        else f"{platform.machine()}, {os.cpu_count()} cores, " f"load average {os.getloadavg()[0]:.1f} at the end",
        "recorded": False,
        "output": output,
    }


def _publish(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="", help=f"sources to run anew, comma-separated: {', '.join(BY_NAME)}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not what the saved outputs render")
    parser.add_argument("--from-json", type=Path, default=SAVED, metavar="DIR", help="folder of saved outputs")
    args = parser.parse_args(argv)
    try:
        names = [n for n in args.run.split(",") if n]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise ResultsError(f"--run {','.join(unknown)}: no such source; the sources are {', '.join(BY_NAME)}")
        if names and args.check:
            raise ResultsError("--run and --check: give one of them (--check runs nothing)")
        if not args.from_json.is_dir():
            raise ResultsError(f"--from-json {args.from_json}: not a folder of saved outputs")
        for path in (*PAGES, *(args.from_json / f"{n}.json" for n in names)):
            if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise ResultsError(f"{path}: cannot write there; give --from-json a folder you can write")
        texts = {}
        for page in PAGES:
            try:
                texts[page] = page.read_text()
            except OSError as exc:
                raise ResultsError(f"{page}: cannot read it ({exc.strerror or exc})") from None
        check_markers(texts)
        saved = load(args.from_json, skip=names)  # all checked before a bench runs
        for name in names:
            saved[name] = check(BY_NAME[name], run(BY_NAME[name]), args.from_json / f"{name}.json")
        new = {page: rewrite(text, saved) for page, text in texts.items()}
    except ResultsError as exc:
        print(f"results: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, BenchFailed) else 2
    for name in names:
        _publish(args.from_json / f"{name}.json", json.dumps(saved[name], indent=1) + "\n")
    stale = [page for page in PAGES if new[page] != texts[page]]
    if args.check:
        for page in stale:
            print(f"results: {page.relative_to(ROOT)} is stale; run: python scripts/bench/results.py", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        _publish(page, new[page])
    for page in PAGES:
        print(f"results: {page.relative_to(ROOT)} {'rewritten' if page in stale else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
