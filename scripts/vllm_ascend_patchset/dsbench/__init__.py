"""The dual-stream bench on the CPU: ``make bench-ds`` (docs/dual-stream.md, "Measuring it on the CPU").

Two gloo processes (TP = 2) run vLLM's real Qwen3 layers through the patch set's
``DualStreamQwen3ForCausalLM``, single-stream and dual-stream, over an emulated link:
every all-reduce is a gloo collective (the ranks meet) and completes no earlier than
``alpha + bytes / beta`` after the link could start it, waiting without using the CPU, so
its wire time overlaps compute as it does on a device.

Modules: ``batches`` (the CPU stand-in of ``AscendMetadata``, shared with the tests),
``link`` (the emulated link and its stream backend), ``attention`` (a paged-KV CPU
attention in place of vLLM's), ``cases`` (model, batch shapes, link presets), ``rank``
(one TP rank: the model, the measured gate, the timed forwards), ``report`` (figures and
tables), ``command`` (flags, the two processes, the output), ``saved`` (a saved ``--out`` file read
back for ``--from-json``, its shape checked).
"""
