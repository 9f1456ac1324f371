"""PNG pictures of twin runs (matplotlib, no display needed).

- ``gantt-<case>.png``: the P stages over time for each policy (from real
  runs); one bar per batch and stage, coloured by the prompt history the batch's
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

    found = {}
    for result in results:
        label = _label(result, rows, chunk_tokens)
        if label and "error" not in result and label not in found:
            found[label] = [BatchRecord.from_json(b) for b in result["batches"] if b["stage_end_ms"]]
    runs = [(f.name, found[f.name]) for f in rows if f.name in found]
    if not runs:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    case = f"{setup.workload.name}-p{setup.num_stages}"
    max_history = max((c.history_tokens + c.chunk_tokens for _, rs in runs for r in rs for c in r.chunks), default=1)
    norm = colors.Normalize(0, max_history)
    cmap = matplotlib.colormaps["viridis"]

    # One time window for every policy: the first MAX_GANTT_BATCHES batches of the first row.
    horizon_ms = max(r.stage_end_ms[-1] for r in runs[0][1][:MAX_GANTT_BATCHES])
    fig, axes = plt.subplots(
        len(runs),
        1,
        figsize=(12, 1.2 + 0.6 * setup.num_stages * len(runs)),
        squeeze=False,
        gridspec_kw={"hspace": 0.45},
    )
    for ax, (label, records) in zip(axes[:, 0], runs, strict=True):
        shown = [r for r in records if r.stage_start_ms[0] < horizon_ms]
        label_chunks = len(shown) <= 40
        for stage in range(setup.num_stages):
            spans, faces = [], []
            for record in shown:
                prefill = [c for c in record.chunks if c.is_prefill]
                history = prefill[0].history_tokens if prefill else max_history
                start, end = record.stage_start_ms[stage], record.stage_end_ms[stage]
                spans.append((start / 1000, (end - start) / 1000))
                faces.append(cmap(norm(history)))
                if label_chunks and stage == 0 and prefill:
                    ax.text(
                        (start + end) / 2000,
                        stage,
                        f"{prefill[0].chunk_tokens}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white",
                    )
            ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=faces, edgecolor="black", linewidth=0.3)
        ax.set_yticks(range(setup.num_stages), [f"stage {s}" for s in range(setup.num_stages)])
        ax.invert_yaxis()
        ax.set_xlim(0, horizon_ms / 1000 * 1.02)
        ax.set_title(label, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(
        "time (s); colour = history at the batch's first prefill chunk (decode-only: top colour); white = idle"
    )
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
