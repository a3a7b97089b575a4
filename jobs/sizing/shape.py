"""A model's shape and what a training step keeps of it: parameter, LoRA and KV-cache counts, and
the bytes per token autograd saves for backward (the memory plan's per-tensor arithmetic).

The memory plan (jobs/sizing/memory_plan.py) adds these up into each stage's per-GPU memory and
prints them; the terms sit apart from that sum since each is read off a library's code path and
checked against a real model on its own (below).

Activations, in bytes per token, read off the code paths of transformers 5.19
(modeling_llama, loss_utils), peft 0.21 (lora/layer.py, lora/bnb.py), bitsandbytes
(Linear4bit, MatMul4Bit) and torch 2.13 (autograd formulas, autocast, SDPA). Each term
is measured byte for byte on CPU (tests/jobs/sizing/test_activation_memory.py): in
float32, under CPU bf16 autocast (which casts linear and SDPA as CUDA's does) and over
a stand-in for a 4-bit base. Read from source only: flash-attn 2 saves what SDPA
without a mask does on CPU (q, k, v, output, logsumexp; and an RNG state); CUDA's
memory-efficient SDPA over packed rows what the CPU's does (its float mask; its
logsumexp padded to 32 tokens); MatMul4Bit keeps no activation (only the packed weight,
on ctx). 8-bit bases are sized as 4-bit ones (MatMul8bitLt also keeps each projection's
input, not counted). Dtypes:
c compute (bf16 2 under GPU autocast, float32 4 on CPU); s the residual stream's,
which is the embeddings' (4 under k-bit training, whose embeddings and norms PEFT
upcast, and under full fine-tuning's float32 weights; else c); o the base
projections' outputs (s under k-bit: bitsandbytes' Linear4bit casts its input to
bf16 and its output back to the input's dtype; else c). A frozen weight's matmul
saves no activation (torch saves an operand only for the other's gradient).

- norms: each RMSNorm saves its input in float32 (`.to(float32)` then pow; a copy
  when s is 2) and rsqrt's result: 4 x hidden + 4; when its weight trains, also
  the normalised tensor, s x hidden. The first layer's input norm saves nothing
  when the embeddings' output needs no gradient (LoRA without checkpointing; the
  count then assumes q, k or v carries LoRA, as every preset's does).
- linear inputs, for the weight gradients of LoRA's A (or of full fine-tuning's
  weights): a c-byte copy per module under autocast when PEFT casts the input to
  the adapter's float32 (peft's `_cast_input_dtype`, skipped by its 4-bit layer
  under CUDA autocast) and autocast casts that back to bf16 for the matmul (the
  float32 copy is transient), or when the input's dtype is not c; otherwise one
  tensor shared by the modules reading it (q/k/v, gate/up), none for o_proj under
  flash/SDPA, whose input is the attention output already saved.
- lora_A outputs, saved for lora_B's gradient: rank x c per LoRA module.
- attention: q, k, v and output in c (autocast casts float32 q/k/v to bf16) and the
  float32 logsumexp per head. flash-attn 2 (and SDPA without a mask) keeps k and v
  at the KV heads' width; SDPA over packed rows, whose block-diagonal mask turns off
  GQA in transformers, keeps them repeated to every head, plus the mask converted to
  c per layer (c x seq per token); eager keeps q, k, v at full width and the
  seq x seq probabilities in float32, plus their c copy under autocast.
  `attention: auto` is sized as SDPA (flash-attn 2 runs only where installed).
- mlp: gate_proj's output (SiLU's backward), SiLU's output and up_proj's (the
  product's): 3 x o x intermediate.
- with gradient checkpointing (non-reentrant), only each layer's input, s x hidden,
  plus the larger of one layer's set (recomputed in backward) and the loss's peak.
- outside the layers: RoPE's cos and sin, 2 x head_dim x s (shared by the layers);
  the final norm; lm_head's input when it trains; the loss: transformers upcasts
  the logits to float32 and log_softmax saves its float32 output (4 x vocab) and
  nll_loss the int64 labels (8); in backward nll_loss's gradient and log_softmax's,
  both float32, join it (8 x vocab more) while every layer's tensors are still held.
- weight copies (bytes, not per token): under autocast the bf16 casts of the LoRA
  weights (cached for the step, saved by their matmuls; one layer's under
  checkpointing); under k-bit the bf16 cast of lm_head's float32 weight; and one
  dequantized 4-bit projection at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.config import ConfigError

# Shapes of the presets' hub models (from their config.json), so the plan needs no download.
KNOWN_SHAPES = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    "meta-llama/Llama-3.1-70B-Instruct": dict(
        num_hidden_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2",
        num_hidden_layers=28,
        hidden_size=1536,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}


@dataclass(frozen=True)
class Precision:
    """How a training stage runs, as far as the tensors autograd saves go (module docstring):
    bytes per element of the compute dtype, the residual stream's and the base projections' outputs."""

    compute: int
    stream: int
    linear_out: int
    full: bool = False  # every weight trains
    quantized: bool = False  # bitsandbytes base: its LoRA layer skips PEFT's float32 cast under autocast
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    attention: str = "sdpa"  # "flash" (flash-attn 2, or SDPA without a mask), "sdpa" (over packed rows), "eager"

    @classmethod
    def of(cls, train, gpu: bool = True, attention: str | None = None) -> Precision:
        """A TrainConfig's precision on GPU (bf16 autocast) or CPU (float32). `attention: auto` is sized as
        SDPA, the larger of what it picks (flash-attn 2 only when installed)."""
        compute = 2 if gpu else 4
        full, quantized = train.method == "full", train.quantization != "none"
        stream = 4 if full or quantized else compute
        kernel = attention or {"flash_attention_2": "flash", "eager": "eager"}.get(train.attention, "sdpa")
        return cls(
            compute,
            stream,
            stream if quantized else compute,
            full,
            quantized,
            train.lora_rank,
            tuple(train.lora_targets),
            kernel,
        )

    @property
    def autocast(self) -> bool:
        return self.compute < 4


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder (Llama, Qwen2): what its parameter, LoRA and KV-cache sizes follow from."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool = False  # Qwen2's q, k and v projections carry a bias (its config has no key for it)

    @classmethod
    def from_config(cls, c: dict) -> Shape:
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(
            c["num_hidden_layers"],
            c["hidden_size"],
            c["intermediate_size"],
            c["num_attention_heads"],
            c.get("num_key_value_heads", c["num_attention_heads"]),
            head_dim,
            c["vocab_size"],
            c.get("tie_word_embeddings", False),
            c.get("attention_bias", c.get("model_type") == "qwen2"),
        )

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a decoder layer."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def linear_params(self) -> int:
        return self.layers * sum(a * b for a, b in self.projections().values())

    def params(self) -> int:
        norms = (2 * self.layers + 1) * self.hidden
        biases = self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return self.embedding_params() + self.linear_params() + norms + biases

    def lora_params(self, rank: int, targets: list[str]) -> int:
        return self.layers * sum(rank * (a + b) for name, (a, b) in self.projections().items() if name in targets)

    def layer_activations(
        self, p: Precision, seq_len: int, input_grad: bool = True, checkpointed: bool = False
    ) -> dict[str, int]:
        """Bytes per token one decoder layer's forward leaves saved for backward, by term (module docstring).
        `input_grad`: whether the layer's input needs a gradient; `checkpointed`: only its input is kept."""
        h, q, kv, i, c, s = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
            p.compute,
            p.stream,
        )
        if checkpointed:
            return {"layer input": s * h}
        trains = [name for name in self.projections() if p.full or name in p.lora_targets]
        inputs = 0
        for group, width, dtype in (
            (("q_proj", "k_proj", "v_proj"), h, s),
            (("o_proj",), q, c),
            (("gate_proj", "up_proj"), h, s),
            (("down_proj",), i, p.linear_out),
        ):
            n = len([name for name in group if name in trains])
            if p.autocast and (dtype != c or not (p.full or p.quantized)):
                inputs += n * c * width  # a cast copy per module
            elif n and (group != ("o_proj",) or p.attention == "eager"):
                inputs += c * width  # one tensor for the group
        attention = {
            "flash": c * (2 * q + 2 * kv) + 4 * self.heads,
            "sdpa": c * (4 * q + seq_len) + 4 * self.heads,
            "eager": 3 * c * q + (4 + (c if p.autocast else 0)) * self.heads * seq_len,
        }[p.attention]
        norm = 4 * h + 4 + (s * h if p.full else 0)
        lora_a = 0 if p.full else len(trains) * p.lora_rank * c
        return {
            "norms": norm * (2 if input_grad else 1),
            "linear inputs": inputs,
            "lora_A outputs": lora_a,
            "attention": attention,
            "mlp": 3 * p.linear_out * i,
        }

    def outer_activations(self, p: Precision) -> dict[str, int]:
        """Bytes per token saved outside the decoder layers (module docstring); "loss backward" is the
        gradients that join the loss's saved tensors at the start of backward."""
        h, s = self.hidden, p.stream
        return {
            "rope": 2 * self.head_dim * s,
            "embedding": 8 if p.full else 0,  # its int64 indices, for the weight's gradient
            "final norm": 4 * h + 4 + (s * h if p.full else 0),
            "lm_head input": p.compute * h if p.full else 0,
            "loss": 4 * self.vocab + 8,
            "loss backward": 8 * self.vocab,
        }

    def activation_bytes_per_token(self, p: Precision, seq_len: int, checkpointing: bool) -> float:
        """Peak bytes per token of the activations: at the loss's backward every layer's tensors (their
        inputs alone under checkpointing) and the loss's; under checkpointing, or one layer recomputed."""
        layer = sum(self.layer_activations(p, seq_len).values())
        outer = self.outer_activations(p)
        shared, head = outer["rope"] + outer["embedding"], sum(outer.values()) - outer["rope"] - outer["embedding"]
        if checkpointing:
            return (
                self.layers * sum(self.layer_activations(p, seq_len, checkpointed=True).values())
                + shared
                + max(head, layer)
            )
        first = sum(self.layer_activations(p, seq_len, input_grad=p.full).values())
        return (self.layers - 1) * layer + first + shared + head

    def weight_copies(self, p: Precision) -> dict[str, float]:
        """Bytes (not per token) of the bf16 weight copies autocast makes and autograd saves: per layer (LoRA's,
        or every projection's under full fine-tuning), lm_head's (float32 under k-bit or full fine-tuning)."""
        if not p.autocast:
            return {"layer": 0, "lm_head": 0}
        layer = self.linear_params() if p.full else self.lora_params(p.lora_rank, list(p.lora_targets))
        lm_head = self.vocab * self.hidden if p.full or p.quantized else 0
        return {"layer": layer / self.layers * p.compute, "lm_head": lm_head * p.compute}

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # keys and values, bf16


def load_shape(model_path: str, model_config: str | None = None) -> Shape:
    if model_config:
        return Shape.from_config(json.loads(Path(model_config).read_text()))
    local = Path(model_path).expanduser() / "config.json"
    if local.is_file():
        return Shape.from_config(json.loads(local.read_text()))
    if model_path in KNOWN_SHAPES:
        return Shape.from_config(KNOWN_SHAPES[model_path])
    raise ConfigError(f"no shape for {model_path}: pass --model-config with its config.json")
