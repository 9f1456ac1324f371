"""What the dual-stream bench runs: the model, the batches, the link presets.

The model is a small Qwen3 dense (vLLM's layers, TP = 2): the MLP holds most of the
weights as in Qwen3-32B, attention is grouped (2 query heads per KV head), and with 6
layers a forward issues 13 all-reduces (one after the embedding, two per layer), so the
first and last half-layer a dual-stream forward cannot overlap weigh as little as they
can on a CPU budget.

Batches (the shapes of the reference serving setting and of chunked prefill):

- ``prompts``: equal fresh prompts, from 2 x 128 tokens up to 6 x 2600 (15.6k tokens);
- ``mixed``: 32 decodes over 1k tokens of history each, then prefills (one continuing a
  chunked prompt over 2k of history, the rest fresh), from 1k to 16k tokens;
- ``long``: 8 decodes and one long prompt: no request boundary leaves both micro-batches
  enough tokens, the gate keeps it single-stream whatever the link (shown, not timed).

Link presets: the share of communication in single-stream time at the reference batch
(``REFERENCE``) is set to about 20%, 35% and 55% (the range reported for prefill on
Ascend 910B/910C); ``bare`` is the machine as it is (gloo's own cost, no emulated
delay). ``alpha`` is fixed per message and ``beta`` is derived from the compute time
measured at start (``beta_for_share``), so the shares hold on a faster or slower host.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend_patchset.dsbench.batches import Request

MODEL_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}
MAX_NUM_BATCHED_TOKENS = 16000  # holds the largest batch; the measured gate's classes reach 4096 (half of it)
QUICK_MAX_NUM_BATCHED_TOKENS = 1024
BLOCK_SIZE = 128
DECODES, DECODE_HISTORY, CHUNK_HISTORY = 32, 1024, 2048
ALPHA_S = 20e-6  # per message: an in-node collective's launch and synchronisation


@dataclass(frozen=True)
class Case:
    name: str
    requests: tuple[Request, ...]
    timed: bool = True

    @property
    def tokens(self) -> int:
        return sum(r.query_tokens for r in self.requests)

    @property
    def shape(self) -> str:
        return self.name.split(":")[0]


def prompts(count: int, length: int) -> Case:
    return Case(f"prompts:{count}x{length}", tuple(Request(0, length) for _ in range(count)))


def mixed(total: int, fresh_prompts: int) -> Case:
    """``DECODES`` decodes, one chunk over ``CHUNK_HISTORY`` and ``fresh_prompts`` fresh prompts: ``total`` tokens."""
    decodes = [Request(DECODE_HISTORY, 1)] * DECODES
    prefill_tokens = total - DECODES
    each = prefill_tokens // (1 + fresh_prompts)
    chunk = prefill_tokens - each * fresh_prompts
    return Case(f"mixed:{total}", (*decodes, Request(CHUNK_HISTORY, chunk), *[Request(0, each)] * fresh_prompts))


def probe_traffic(size_class: int) -> Case:
    """A batch of the measured gate's ``size_class``: equal prompts of at most 1024 tokens, two micro-batches
    of ``size_class`` tokens each (what a deployment's first batches of that size might be)."""
    count = max(2, 2 * size_class // 1024)
    return prompts(count, 2 * size_class // count)


def long_prompt(total: int) -> Case:
    return Case(f"long:{total}", (*[Request(DECODE_HISTORY, 1)] * 8, Request(0, total - 8)), timed=False)


CASES = (
    prompts(2, 128),
    prompts(4, 256),
    prompts(2, 2600),
    prompts(6, 2600),
    mixed(1024, 1),
    mixed(4096, 2),
    mixed(8192, 3),
    long_prompt(8192),
)
QUICK_CASES = (prompts(2, 128), prompts(2, 512), mixed(1024, 1), long_prompt(1024))  # a smoke run
REFERENCE = prompts(2, 2600)
QUICK_REFERENCE = prompts(2, 512)
BY_NAME = {case.name: case for case in (*CASES, *QUICK_CASES)}


@dataclass(frozen=True)
class Preset:
    name: str
    share: float | None  # target communication share of single-stream time; None: bare machine


PRESETS = {
    "bare": Preset("bare", None),
    "comm20": Preset("comm20", 0.20),
    "comm35": Preset("comm35", 0.35),
    "comm55": Preset("comm55", 0.55),
}


class LinkSettingError(ValueError):
    """A link preset these flags cannot give; the message names the flag to change."""


def beta_for_share(share: float, compute_s: float, messages: int, nbytes: int, alpha_s: float = ALPHA_S) -> float:
    """Bytes per second such that ``messages`` all-reduces of ``nbytes`` take ``share`` of compute + them.

    Communication c with c / (compute + c) = share is c = compute * share / (1 - share),
    spread over the messages: each takes c / messages = alpha + nbytes / beta.
    """
    if not 0 < share < 1:
        raise LinkSettingError(f"a communication share must be in (0, 1), got {share}")
    per_message = compute_s * share / (1 - share) / messages
    if per_message <= alpha_s:
        raise LinkSettingError(
            f"a share of {share:.0%} needs {per_message * 1e6:.1f} us per message, not more than alpha "
            f"({alpha_s * 1e6:.1f} us): lower --alpha-us"
        )
    return nbytes / (per_message - alpha_s)


def messages_per_forward(num_layers: int) -> int:
    """All-reduces of a single-stream forward: the embedding's, then attention's and MLP's per layer."""
    return 1 + 2 * num_layers
