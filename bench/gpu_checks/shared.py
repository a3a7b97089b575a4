"""What the checks share: model widths and batch shapes, random-weight model folders, random token
rows packed by the trainer's own `pack_batch`, the trainer's optimizer step, gradients, timing and memory.

Models are Llamas built from a LlamaConfig with random weights (no hub, no tokenizer), directly on
the device in its training dtype, saved once with save_pretrained, and loaded by the project's
`load_base` like a real base. A shallower copy of a saved model (`fewer_layers`) is a folder with
a config of fewer layers beside links to the same weight files: nothing is written twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch

from train.config import TrainConfig
from train.data import pack_batch
from train.model import compute_dtype, packs_into_one_row, trained_parameters, unwrap
from train.step import accumulate, apply_step

LLAMA_3 = dict(vocab_size=128256, max_position_embeddings=4096, rope_theta=500000.0)
WIDTHS = {  # Llama-3.1-8B and Llama-3.1-70B (a slice of its 80 layers); --smoke: narrow stand-ins
    "8b": dict(
        LLAMA_3,
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
    ),
    "70b": dict(
        LLAMA_3,
        num_hidden_layers=4,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
    ),
}
SMOKE_WIDTHS = {
    "8b": dict(
        vocab_size=512,
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "70b": dict(
        vocab_size=512,
        num_hidden_layers=4,
        hidden_size=96,
        intermediate_size=192,
        num_attention_heads=6,
        num_key_value_heads=2,
    ),
}
# Micro-batches as the presets feed them (configs/llama-8b.yaml; the student at the paper's 16 rows
# its comment gives, the preset's 8 the lighter case), rows x max_length, row lengths drawn from
# [shortest, longest]: means of 256 and 112 tokens (docs/scaling.md assumes ~250 for a WMDP row,
# ~119 for a number row), so several rows share most packed sequences.
SHAPES = {
    "teacher": dict(rows=8, max_length=512, shortest=64, longest=448),
    "student": dict(rows=16, max_length=256, shortest=64, longest=160),
}
SMOKE_SHAPES = {
    "teacher": dict(rows=8, max_length=64, shortest=8, longest=56),
    "student": dict(rows=16, max_length=32, shortest=8, longest=20),
}


@dataclasses.dataclass
class Context:
    device: torch.device
    smoke: bool
    workdir: Path

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def shapes(self) -> dict:
        return SMOKE_SHAPES if self.smoke else SHAPES

    def width(self, name: str) -> dict:
        return (SMOKE_WIDTHS if self.smoke else WIDTHS)[name]

    def cfg(self, **overrides) -> TrainConfig:
        """The presets' LoRA (rank 16, alpha 32, every linear layer), at a learning rate that moves a random model in a few steps."""
        return TrainConfig(**{"use_gpu": self.gpu, "lora_rank": 16, "lora_alpha": 32, "lr": 1e-3, **overrides})

    def tolerance(self, gpu: float, cpu: float) -> float:
        return gpu if self.gpu else cpu

    def model(self, name: str, layers: int | None = None) -> str:
        """The folder of model `name` (built on first use), or of its first `layers` layers."""
        folder = self.workdir / name
        if not (folder / "config.json").is_file():
            build_model(folder, self.width(name), self.device)
        return str(folder if layers is None else fewer_layers(folder, layers))


def build_model(folder: Path, width: dict, device: torch.device) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**width), dtype=compute_dtype(device))
    model.save_pretrained(folder)
    del model
    free(device)


def fewer_layers(folder: Path, layers: int) -> Path:
    out = folder.with_name(f"{folder.name}-{layers}-layers")
    if not out.is_dir():
        out.mkdir()
        config = json.loads((folder / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        for f in folder.iterdir():
            if f.name != "config.json":
                (out / f.name).symlink_to(f.resolve())
    return out


def random_rows(n: int, shortest: int, longest: int, vocab: int, seed: int) -> dict:
    """`n` token rows of lengths in [shortest, longest], the first quarter of each a prompt (no labels)."""
    rng = np.random.default_rng(seed)
    ids, labels = [], []
    for _ in range(n):
        row = rng.integers(3, vocab, int(rng.integers(shortest, longest + 1)))
        ids.append(row)
        labels.append(np.where(np.arange(len(row)) < len(row) // 4, -100, row))
    return {"input_ids": np.array(ids, dtype=object), "labels": np.array(labels, dtype=object)}


def shape_rows(shape: dict, vocab: int, seed: int) -> dict:
    return random_rows(shape["rows"], shape["shortest"], shape["longest"], vocab, seed)


def packed(rows: dict, max_length: int, model, device: torch.device) -> dict:
    """The trainer's packing of `rows`, in the layout `model`'s attention needs, on `device`."""
    batch = pack_batch(
        rows, max_length, pad_id=0, one_row=packs_into_one_row(unwrap(model).config._attn_implementation)
    )
    return {k: v.to(device) for k, v in batch.items()}


def optimizer_step(model, opt, sched, micro_batches: list[dict], cfg: TrainConfig, number_ids=None) -> float:
    """One optimizer step over `micro_batches` as train/loop.py's train_job takes it (that function
    needs Ray Train), through its own `accumulate` and `apply_step`; returns the mean loss."""
    last = len(micro_batches) - 1
    losses = [
        accumulate(model, batch, len(micro_batches), i == last, number_ids) for i, batch in enumerate(micro_batches)
    ]
    apply_step([p for p in model.parameters() if p.requires_grad], opt, cfg.max_grad_norm)
    if sched is not None:
        sched.step()
    return float(sum(losses)) / len(micro_batches)


def flat_grads(model) -> torch.Tensor:
    """Every trained weight's gradient (name order) as one float32 vector; the gradients are then cleared."""
    params = [p for _, p in trained_parameters(model)]
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten() for p in params]
    )
    unwrap(model).zero_grad(set_to_none=True)
    return flat


def flat_weights(model) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for _, p in trained_parameters(model)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (L2)."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def allocated_gib(device: torch.device) -> float | None:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Folder:
    """A checkpoint folder as train/outputs.py reads a ray.train.Checkpoint (`as_directory`), without Ray."""

    def __init__(self, path: Path):
        self.path = str(path)

    @contextlib.contextmanager
    def as_directory(self):
        yield self.path


@contextlib.contextmanager
def sdpa_backends():
    """The SDPA kernels PyTorch's dispatcher picks for the attention calls made inside (its own
    choice, `torch._fused_sdp_choice`, on each call's arguments), as a set of names; empty when
    no call went through SDPA (flash-attn 2), "unknown (why)" where the choice could not be read."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    seen: set = set()
    original = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        try:  # the same arguments as the call's
            seen.add(SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name)
        except Exception as e:  # a PyTorch without it, or with another signature
            seen.add(f"unknown ({type(e).__name__}: {e})"[:200])
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = recording
    try:
        yield seen
    finally:
        F.scaled_dot_product_attention = original
