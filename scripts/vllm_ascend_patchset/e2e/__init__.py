"""End-to-end CPP and dual stream on vLLM 0.23.0's CPU engine, real PP and TP (docs/e2e.md).

Modules: ``model`` (the tiny Qwen3 made locally), ``serve`` (``vllm serve`` with CPP's
engine-core hooks), ``engine_hooks`` (what runs in the spawned engine core), ``worker``
(the CPU worker extension: profiling RPC and step timing through worker/cpp_timing.py),
``servers`` (the server processes, the servers of the twin's policies and the client that
measures TTFT), ``smoke`` (the CI smoke test and the uneven-stages check), ``bench``
(``make bench-e2e``), ``twin_predict`` (the twin's prediction of the bench's cases);
dual stream's: ``ds_worker`` and ``ds_cpp_worker`` (the worker extensions), ``ds_metadata``
(the CPU attention splitter), ``ds_env`` (what the servers tell their workers),
``ds_smoke`` (the CI smoke at TP = 2 and PP = 2 x TP = 2), ``ds_bench`` (``make
bench-e2e-ds``); ``run`` (the command line).
"""
