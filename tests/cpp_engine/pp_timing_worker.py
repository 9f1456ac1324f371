"""One PP rank of the step-timing transport test: ``python -m cpp_engine.pp_timing_worker RANK WORLD PORT OUT``.

Each rank is a pipeline stage of vLLM's real PP group over gloo. For every step of
``STEPS`` it runs the hooks of worker/cpp_timing.py as the model runner does (start at
execute_model, finish when the output is ready), with a stand-in clock that advances by
the stage's cost for that step, and passes its output on exactly as the NPU worker does
(``isend_tensor_dict`` / ``irecv_tensor_dict`` into ``AsyncIntermediateTensors``). The
last rank writes what each step reported; every rank writes the keys its model input
held and its device synchronisations. The pytest side (test_cpp_timing_pp.py) asserts.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

# (cpp_time_step, per-stage cost in ms) for a 3-stage pipeline
STEPS = [
    (True, (10.0, 40.0, 20.0)),
    (True, (40.0, 10.0, 20.0)),
    (True, (10.0, 10.0, 30.0)),
    (False, (40.0, 10.0, 20.0)),
    (True, (15.0, 5.0, 5.0)),
]


class Clock:
    def __init__(self):
        self.now_s = 0.0

    def perf_counter(self):
        return self.now_s


class Runner:
    def __init__(self):
        self.syncs = 0

    def _sync_device(self):
        self.syncs += 1


def main(rank: int, world: int, port: int, out_path: str) -> None:
    from types import SimpleNamespace

    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.gpu_worker import AsyncIntermediateTensors
    from vllm_ascend.worker import cpp_timing

    result = {"rank": rank, "steps": [], "errors": []}
    try:
        with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
            ps.init_distributed_environment(
                world_size=world,
                rank=rank,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                local_rank=rank,
                backend="gloo",
            )
            ps.initialize_model_parallel(1, world, backend="gloo")
        pp, tp = ps.get_pp_group(), ps.get_tp_group()
        clock = Clock()
        cpp_timing.time = clock  # the module's clock: each stage's cost is what the step says
        runner = Runner()
        for marked, costs_ms in STEPS:
            scheduler_output = SimpleNamespace(cpp_time_step=marked)
            received = None
            if not pp.is_first_rank:
                tensors, handles, postprocess = pp.irecv_tensor_dict(all_gather_group=tp)
                received = AsyncIntermediateTensors(tensors, comm_handles=handles, comm_postprocess=postprocess)
            syncs_before = runner.syncs
            cpp_timing.start_step_timing(runner, scheduler_output, received)
            step = {"model_input_keys": sorted(received.tensors) if received is not None else []}
            clock.now_s += costs_ms[rank] / 1000.0
            if pp.is_last_rank:
                output = SimpleNamespace()
                cpp_timing.finish_step_timing(runner, output)
                step["execution_time_ms"] = getattr(output, "execution_time_ms", None)
            else:
                hidden = IntermediateTensors({"hidden_states": torch.full((4, 8), float(rank))})
                cpp_timing.finish_stage_timing(runner, hidden)
                step["sent_keys"] = sorted(hidden.tensors)
                for handle in pp.isend_tensor_dict(hidden.tensors, all_gather_group=tp):
                    handle.wait()
            step["syncs"] = runner.syncs - syncs_before
            result["steps"].append(step)
    except Exception:
        result["errors"].append(traceback.format_exc())
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
