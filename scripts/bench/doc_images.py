#!/usr/bin/env python3
"""The pictures of the docs, made again: ``make doc-images`` (docs/images/).

- ``cpp-twin-gantt-long-32k-p4.png``: the twin's Gantt chart of one 32k prompt at P = 4 on
  the committed CPU surface under vLLM's fixed chunk, upstream's CPP and ours
  (``cpp-twin --plot``, docs/cpp-twin.md "Pictures"; the twin's simulated time, so the same
  commit draws the same bars).
- ``dual-stream-timeline.png``: one TP rank's compute and communication streams over two
  decoder layers, single stream against dual stream (docs/dual-stream.md). A schematic:
  the durations are chosen, not measured; the order is the schedule's
  (``dual_stream/schedule.py``: attention, then MLP, of micro-batch 0 then 1, each
  half-layer's all-reduce on the communication stream in the order issued, and each
  compute waiting only for its own micro-batch's reduced input).

    PYTHONPATH=scripts .venv/bin/python scripts/bench/doc_images.py [--out docs/images]

Each picture is written beside its final place and renamed into it; one over
``MAX_BYTES`` is reported (exit 1) so the docs stay light.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling package
from vllm_ascend_patchset.paths import CPU_SURFACE, ROOT  # noqa: E402

GANTT = "cpp-twin-gantt-long-32k-p4.png"
TIMELINE = "dual-stream-timeline.png"
MAX_BYTES = 100_000
TWIN_ARGS = ["--surface", str(CPU_SURFACE), "--workload", "long:32k", "--stages", "4"]
TWIN_ARGS += ["--policies", "fixed,upstream,ours"]
# Schematic durations (arbitrary units) per micro-batch: half a batch's attention, MLP and all-reduce.
ATTN, MLP, REDUCE = 1.0, 1.3, 0.8
LAYERS = 2


def single_stream(layers: int = LAYERS) -> list[tuple[str, str, int, float, float]]:
    """(stream, kind, micro-batch, start, end) of the whole batch on one stream: compute, then wait for its reduce."""
    spans, t = [], 0.0
    for _ in range(layers):
        for kind, cost in (("attn", ATTN), ("mlp", MLP)):
            spans.append(("compute", kind, -1, t, t + 2 * cost))
            t += 2 * cost
            spans.append(("comm", "reduce", -1, t, t + 2 * REDUCE))
            t += 2 * REDUCE
    return spans


def dual_stream(layers: int = LAYERS) -> list[tuple[str, str, int, float, float]]:
    """The same work as two micro-batches in the schedule's order (run_layers): each compute waits for the event
    its input's all-reduce records; the communication stream runs the all-reduces in the order they are issued."""
    spans = []
    compute_free = comm_free = 0.0
    ready = {(-1, "mlp", i): 0.0 for i in (0, 1)}  # FFN_AR_FINISH of the layer before the first
    for layer in range(layers):
        for kind, cost, waits in (("attn", ATTN, (layer - 1, "mlp")), ("mlp", MLP, (layer, "attn"))):
            for i in (0, 1):
                start = max(compute_free, ready[(*waits, i)])  # FFN_AR_FINISH / ATTN_AR_FINISH
                compute_free = start + cost  # records ATTN_COM_FINISH / FFN_COM_FINISH
                spans.append(("compute", kind, i, start, compute_free))
                begin = max(comm_free, compute_free)
                comm_free = begin + REDUCE
                spans.append(("comm", "reduce", i, begin, comm_free))
                ready[(layer, kind, i)] = comm_free
    return spans


def draw_timeline(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {-1: "#7f7f7f", 0: "#1f77b4", 1: "#ff7f0e"}
    fig, axes = plt.subplots(2, 1, figsize=(8, 2.8), sharex=True, gridspec_kw={"hspace": 0.6})
    cases = (("single stream", single_stream()), ("dual stream", dual_stream()))
    for ax, (title, spans) in zip(axes, cases, strict=True):
        for stream, kind, mb, start, end in spans:
            row = 0 if stream == "compute" else 1
            hatch = "//" if kind == "reduce" else None
            ax.broken_barh([(start, end - start)], (row - 0.35, 0.7), facecolors=colours[mb], edgecolor="black",
                           linewidth=0.4, hatch=hatch, alpha=0.85)  # fmt: skip
            label = kind if mb < 0 else f"{kind} {mb}"
            if kind != "reduce":
                ax.text((start + end) / 2, row, label, ha="center", va="center", fontsize=7, color="white")
        end = max(s[4] for s in spans)
        ax.set_yticks([0, 1], ["compute", "comm"])
        ax.invert_yaxis()
        ax.set_title(f"{title}: {end:.1f} units for {LAYERS} layers", fontsize=9, loc="left")
    axes[-1].set_xlabel("time (schematic); hatched = TP all-reduce; blue / orange = micro-batch 0 / 1")
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def draw_gantt(path: Path, scratch: Path) -> None:
    command = [sys.executable, "-m", "vllm_ascend_patchset", "cpp-twin", *TWIN_ARGS, "--plot", str(scratch)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    done = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    made = scratch / "gantt-long-32k-p4.png"
    if done.returncode != 0 or not made.is_file():
        raise RuntimeError(f"cpp-twin {' '.join(TWIN_ARGS)} --plot exited {done.returncode} without {made.name}")
    shutil.copyfile(made, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="folder the pictures go to")
    parser.add_argument("--only", choices=("gantt", "timeline"), help="make one picture")
    args = parser.parse_args(argv)
    if not args.out.is_dir() or not os.access(args.out, os.W_OK):
        print(f"doc-images: error: --out {args.out}: not a folder you can write", file=sys.stderr)
        return 2
    made = []
    with tempfile.TemporaryDirectory(dir=args.out, prefix=".doc-images-") as scratch:
        work = Path(scratch)
        try:
            if args.only in (None, "timeline"):
                draw_timeline(work / TIMELINE)
                made.append(TIMELINE)
            if args.only in (None, "gantt"):
                draw_gantt(work / GANTT, work / "plot")
                made.append(GANTT)
        except RuntimeError as exc:
            print(f"doc-images: error: {exc}; nothing replaced", file=sys.stderr)
            return 1
        for name in made:
            (work / name).replace(args.out / name)
    heavy = [n for n in made if (args.out / n).stat().st_size > MAX_BYTES]
    for name in made:
        print(f"doc-images: {args.out / name} ({(args.out / name).stat().st_size // 1000} KB)")
    if heavy:
        print(f"doc-images: error: {', '.join(heavy)} over {MAX_BYTES // 1000} KB; draw it smaller", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
