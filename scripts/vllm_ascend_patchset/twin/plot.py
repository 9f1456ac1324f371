"""PNG pictures of twin runs (matplotlib, no display needed).

- ``gantt-<case>.png``: the P stages over time for each policy (the seed's diagram, from
  real runs); one bar per batch and stage, coloured by the prompt history the batch's
  prefill starts at, so growing attention cost is visible as colour; white is bubble.
- ``chunks-<case>.png``: chunk size and per-stage batch time against history.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .pipeline import BatchRecord
from .policies import Setup
from .report import Figures

MAX_GANTT_BATCHES = 48  # a mixed run is drawn over its first batches only


def _label(result: dict[str, Any], rows: Sequence[Figures], chunk_tokens: int) -> str | None:
    policy = result["policy"]
    if policy["kind"] == "fixed":
        wanted = {f.name for f in rows}
        if f"vllm-fixed-{chunk_tokens}" in wanted and policy["max_num_batched_tokens"] == chunk_tokens:
            return f"vllm-fixed-{chunk_tokens}"
        tuned = f"tuned-fixed-{policy['max_num_batched_tokens']}"
        return tuned if tuned in wanted else None
    return policy["name"]


def plot_case(
    out_dir: Path, setup: Setup, results: Sequence[dict[str, Any]], rows: Sequence[Figures], chunk_tokens: int
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors

    runs = []
    for result in results:
        label = _label(result, rows, chunk_tokens)
        if label and "error" not in result and label not in [r[0] for r in runs]:
            runs.append((label, [BatchRecord.from_json(b) for b in result["batches"] if b["stage_end_ms"]]))
    if not runs:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    case = f"{setup.workload.name}-p{setup.num_stages}"
    max_history = max((c.history_tokens + c.chunk_tokens for _, rs in runs for r in rs for c in r.chunks), default=1)
    norm = colors.Normalize(0, max_history)
    cmap = matplotlib.colormaps["viridis"]

    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 1.0 + 0.55 * setup.num_stages * len(runs)), squeeze=False)
    horizon = 0.0
    for _, records in runs:
        shown = records[:MAX_GANTT_BATCHES]
        horizon = max(horizon, max(r.stage_end_ms[-1] for r in shown))
    for ax, (label, records) in zip(axes[:, 0], runs, strict=True):
        shown = records[:MAX_GANTT_BATCHES]
        for record in shown:
            prefill = [c for c in record.chunks if c.is_prefill]
            history = prefill[0].history_tokens if prefill else max_history
            for stage in range(setup.num_stages):
                start, end = record.stage_start_ms[stage], record.stage_end_ms[stage]
                ax.barh(
                    stage,
                    (end - start) / 1000,
                    left=start / 1000,
                    height=0.8,
                    color=cmap(norm(history)),
                    edgecolor="black",
                    linewidth=0.4,
                )
                if len(shown) <= 40 and stage == 0 and prefill:
                    ax.text(
                        (start + end) / 2000,
                        stage,
                        f"{prefill[0].chunk_tokens}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white",
                    )
        ax.set_yticks(range(setup.num_stages), [f"stage {s}" for s in range(setup.num_stages)])
        ax.invert_yaxis()
        ax.set_xlim(0, horizon / 1000 * 1.02)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (s); bar colour = history at the chunk's start; white = idle")
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes[:, 0], label="history tokens", fraction=0.02)
    fig.suptitle(f"{case}: pipeline stages over time")
    gantt = out_dir / f"gantt-{case}.png"
    fig.savefig(gantt, dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, (ax_chunk, ax_time) = plt.subplots(1, 2, figsize=(12, 4))
    for label, records in runs:
        points = [
            (c.history_tokens, c.chunk_tokens, max(r.stage_ms)) for r in records for c in r.chunks if c.is_prefill
        ]
        if not points:
            continue
        points.sort()
        history = [p[0] for p in points]
        style = "-o" if len(setup.workload.requests) == 1 else "o"
        ax_chunk.plot(history, [p[1] for p in points], style, markersize=3, label=label)
        ax_time.plot(history, [p[2] for p in points], style, markersize=3, label=label)
    ax_chunk.set_xlabel("history tokens")
    ax_chunk.set_ylabel("chunk tokens")
    ax_time.set_xlabel("history tokens")
    ax_time.set_ylabel("slowest stage time of the batch (ms)")
    ax_chunk.legend(fontsize=8)
    fig.suptitle(f"{case}: chunk size and batch time against history")
    chunks = out_dir / f"chunks-{case}.png"
    fig.savefig(chunks, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [gantt, chunks]
