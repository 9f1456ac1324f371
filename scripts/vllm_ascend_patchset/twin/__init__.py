"""CPP pipeline twin: real scheduling code against a simulated P-stage pipeline.

The twin measures what a scheduler's chunking decisions do to time to first token and
to pipeline bubbles, without an Ascend pipeline: it drives a real vLLM 0.23.0 scheduler
object (vLLM's own fixed chunking, upstream vllm-ascend's v0.23.0 CPP scheduler, or ours)
exactly as ``EngineCore.step_with_batch_queue`` does, and takes each stage's time for a
batch from a latency surface (a fitted model, a measured CSV, or the profile an engine
saved). ``python -m vllm_ascend_patchset.twin --help`` for the command line.

Modules: ``pipeline`` (the discrete-event core, independent of vLLM), ``surface``,
``surface_files`` (reading ``--surface``), ``stress`` (shapes a quadratic cannot follow),
``ladder`` (CPP's chunk-size ladder), ``workloads``, ``traces`` (public traces as
workloads), ``options`` (workload and goodput options), ``engine`` (vLLM side, runs
inside a policy's subprocess), ``policies`` (which scheduler, which tree, subprocess
runner), ``optimum``, ``report``, ``slo`` (goodput), ``summary`` (one table over many
cases), ``plot``, ``tune``.
"""
