"""A tiny Qwen3 made locally: random weights from a fixed seed, a word-level tokenizer, no download.

``write_tiny_qwen3(model_dir)`` writes ``config.json``, ``model.safetensors`` (weights
drawn from ``torch.Generator().manual_seed(seed)``), ``generation_config.json`` and a
``tokenizer.json`` whose vocabulary is the words ``w0 .. w{V-1}`` (so ``vllm bench serve``
can make random prompts). ``max_position_embeddings`` allows 32k-token prompts. The
folder is rewritten only when its spec changes (``spec.json``), so a restart sees the
same model and the same CPP profile fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 8192,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
SEED = 20261130
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2


def _spec(config: dict, seed: int) -> dict:
    return {"config": config, "seed": seed, "format": 1}


def _weights(config: dict, seed: int) -> dict:
    """Qwen3 parameter names and shapes as vLLM's loader expects them, N(0, 0.02) from ``seed``."""
    import torch

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes.update(
            {
                f"{p}.input_layernorm.weight": (hidden,),
                f"{p}.post_attention_layernorm.weight": (hidden,),
                f"{p}.self_attn.q_proj.weight": (heads * head_dim, hidden),
                f"{p}.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                f"{p}.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                f"{p}.self_attn.o_proj.weight": (hidden, heads * head_dim),
                f"{p}.self_attn.q_norm.weight": (head_dim,),
                f"{p}.self_attn.k_norm.weight": (head_dim,),
                f"{p}.mlp.gate_proj.weight": (inter, hidden),
                f"{p}.mlp.up_proj.weight": (inter, hidden),
                f"{p}.mlp.down_proj.weight": (hidden, inter),
            }
        )
    generator = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, config["torch_dtype"])
    weights = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shapes[name], dtype=dtype)
        else:
            weights[name] = (torch.randn(shapes[name], generator=generator) * 0.02).to(dtype)
    return weights


def _tokenizer(vocab_size: int) -> dict:
    """A word-level tokenizer.json: special tokens, then ``w<i>`` for every other id."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{index}": index for index in range(len(SPECIAL_TOKENS), vocab_size)})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(SPECIAL_TOKENS)
        ],  # fmt: skip
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def write_tiny_qwen3(model_dir: Path, *, config: dict | None = None, seed: int = SEED) -> Path:
    """The tiny model in ``model_dir`` (written only if missing or of another spec)."""
    from safetensors.torch import save_file

    config = dict(TINY_QWEN3 if config is None else config)
    model_dir = Path(model_dir)
    spec_path = model_dir / "spec.json"
    spec = _spec(config, seed)
    if spec_path.exists() and json.loads(spec_path.read_text()) == spec:
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (model_dir / "generation_config.json").write_text(json.dumps(generation))
    save_file(_weights(config, seed), str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    (model_dir / "tokenizer.json").write_text(json.dumps(_tokenizer(config["vocab_size"])))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": config["max_position_embeddings"],
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    spec_path.write_text(json.dumps(spec))  # last: a half-written folder is rewritten next time
    return model_dir


if __name__ == "__main__":
    import sys

    print(write_tiny_qwen3(Path(sys.argv[1])))
