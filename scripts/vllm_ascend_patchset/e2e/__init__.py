"""End-to-end CPP on vLLM 0.23.0's CPU engine with real pipeline parallelism (docs/e2e.md).

Modules: ``model`` (the tiny Qwen3 made locally), ``serve`` (``vllm serve`` with CPP's
engine-core hooks), ``engine_hooks`` (what runs in the spawned engine core), ``worker``
(the CPU worker extension: profiling RPC and step timing through worker/cpp_timing.py),
``run`` (servers, the client that measures TTFT, ``smoke`` and ``bench``).
"""
