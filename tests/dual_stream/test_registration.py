"""The dual-stream model class changes only the forward of vLLM's Qwen3ForCausalLM.

(Registration through patch 0300 is checked in the TP worker, where vLLM's registry
imports: test_tp_equivalence.py::test_qwen3_dense_resolves_to_the_dual_stream_class.)
"""

from __future__ import annotations

import ast

import conftest

MODEL = conftest.ASSEMBLED / "vllm_ascend" / "models" / "qwen3.py"


def test_the_class_subclasses_vllms_and_overrides_only_forward():
    tree = ast.parse(MODEL.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DualStreamQwen3ForCausalLM")
    assert [ast.unparse(base) for base in cls.bases] == ["Qwen3ForCausalLM"]
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "vllm.model_executor.models.qwen3"]
    assert [alias.name for n in imports for alias in n.names] == ["Qwen3ForCausalLM"]
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    public_overrides = {name for name in methods if not name.startswith("_")}
    assert public_overrides == {"forward"}, "load_weights, compute_logits, embed_input_ids stay vLLM's"
    assert not any(isinstance(n, ast.Assign) for n in cls.body), "no class attribute of vLLM's is replaced"
