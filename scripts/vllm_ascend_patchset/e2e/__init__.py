"""End-to-end CPP on vLLM 0.23.0's CPU engine with real pipeline parallelism (docs/e2e.md).

Modules: ``model`` (the tiny Qwen3 made locally), ``serve`` (``vllm serve`` with CPP's
engine-core hooks), ``engine_hooks`` (what runs in the spawned engine core), ``worker``
(the CPU worker extension: profiling RPC and step timing through worker/cpp_timing.py),
``servers`` (the servers of the twin's policies and the client that measures TTFT),
``smoke`` (the CI smoke test and the uneven-stages check), ``bench`` (``make bench-e2e``),
``twin_predict`` (the twin's prediction of the bench's cases), ``run`` (the command line).
"""
