"""Dual-stream parallelism for Qwen3 dense models under tensor parallelism.

A prefill batch is cut into two micro-batches at a request boundary (``split``); each
decoder layer's attention and MLP all-reduce runs on a communication stream while the
other micro-batch computes (``schedule``, ``streams``), when the batch qualifies
(``gate``). Configured through ``additional_config["dual_stream_config"]`` (``config``);
the model class is ``vllm_ascend.models.qwen3.DualStreamQwen3ForCausalLM``.
"""
