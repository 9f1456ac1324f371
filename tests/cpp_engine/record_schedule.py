"""Record the SchedulerOutputs of a fixed random workload on one vllm_ascend tree.

Run in a subprocess with the pristine tree (``python record_schedule.py TREE MODEL_DIR``)
to get upstream's behaviour, and in-process on the assembled tree for ours. The
workload mixes prompt lengths, shared prefixes (prefix-cache hits), decodes and a KV
pool small enough that requests are preempted.

Modes: ``default`` (BalanceScheduler as installed: balance off, so vLLM's own loop),
``copy`` (balance scheduling switched on with an idle DP view, so upstream's copied
loop runs without changing any decision), ``hooks`` (patched tree only: the copied
loop is selected through ``uses_schedule_hooks`` with the identity hooks).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

NUM_BLOCKS = 40
BLOCK_SIZE = 16
CONFIG = dict(max_num_batched_tokens=128, max_num_seqs=8, max_model_len=2048, block_size=BLOCK_SIZE)


def workload(seed: int = 6) -> list[tuple[int, str, list[int], int, int]]:
    """(arrival step, request id, prompt token ids, max_tokens, priority) tuples."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    items = []
    for index in range(24):
        length = rng.choice([20, 48, 100, 160, 250, 400, 590])
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            shared = min(len(base), rng.choice([64, 128, 256]))
            prompt = base[:shared] + [rng.randrange(1, 1000) for _ in range(max(1, length - shared))]
        else:
            prompt = [rng.randrange(1, 1000) for _ in range(length)]
        prompts.append(prompt)
        items.append((rng.randrange(0, 30), f"req-{index:02d}", prompt, rng.randrange(1, 30), rng.randrange(0, 3)))
    return items


def record(balance_module, mode: str, policy: str, model_dir: Path) -> list[dict]:
    import helpers
    import torch

    scheduler_cls = balance_module.BalanceScheduler
    if mode == "hooks":
        scheduler_cls = type("HookedBalanceScheduler", (scheduler_cls,), {"uses_schedule_hooks": True})
    scheduler = helpers.make_scheduler(
        scheduler_cls, model_dir=model_dir, num_blocks=NUM_BLOCKS, policy=policy, **CONFIG
    )
    if mode == "copy":
        scheduler._balance_enabled = True
        scheduler.balance_queue = [torch.tensor([0], dtype=torch.int)]
    arrivals = [
        (step, helpers.make_request(rid, prompt, max_tokens=n, block_size=BLOCK_SIZE, priority=p, arrival_time=i))
        for i, (step, rid, prompt, n, p) in enumerate(workload())
    ]
    records = [helpers.summarize(out) for out in helpers.run_to_completion(scheduler, arrivals)]
    return json.loads(json.dumps(records))  # the form a subprocess hands back


def main(tree: str, model_dir: str) -> None:
    sys.path.insert(0, tree)
    import npu_stubs

    npu_stubs.install()
    import helpers

    module = helpers.load_balance_module(Path(tree))
    result = {
        f"{mode}/{policy}": record(module, mode, policy, Path(model_dir))
        for mode in ("default", "copy")
        for policy in ("fcfs", "priority")
    }
    sys.stdout.write("\n@@RESULT@@" + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
