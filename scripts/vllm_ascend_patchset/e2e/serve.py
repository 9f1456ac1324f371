"""``vllm serve`` on vLLM's CPU engine with CPP's engine-core hooks.

    python -m vllm_ascend_patchset.e2e.serve --cpp ours -- MODEL [vllm serve options]

``--cpp`` is ``ours`` (the product: pass ``--scheduler-cls`` and ``--worker-extension-cls``
too), ``upstream`` (upstream vllm-ascend v0.23.0's CPP) or ``none`` (vLLM's own
scheduling). Everything after ``--`` goes to vLLM's own CLI as ``vllm serve ...``. The
assembled (or pristine) tree and this tooling are put on ``PYTHONPATH`` so that the
engine core and the workers, which vLLM spawns, import them.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..paths import SCRIPTS_DIR
from ..trees import ASSEMBLED, PRISTINE, tree_root


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m vllm_ascend_patchset.e2e.serve --cpp {ours,upstream,none} -- MODEL ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="vllm_ascend_patchset.e2e.serve")
    parser.add_argument("--cpp", choices=("ours", "upstream", "none"), required=True)
    args = parser.parse_args(argv[:split])

    try:
        tree = tree_root(PRISTINE if args.cpp == "upstream" else ASSEMBLED)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None
    path = [str(tree), str(SCRIPTS_DIR), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    sys.path[:0] = [str(tree), str(SCRIPTS_DIR)]
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

    from vllm.v1.engine.core import EngineCoreProc

    from . import engine_hooks

    os.environ[engine_hooks.POLICY_ENV] = args.cpp
    EngineCoreProc.run_engine_core = engine_hooks.run_engine_core

    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *argv[split + 1 :]]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
