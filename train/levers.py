"""Throughput levers that keep the optimisation the same: fused kernels and torch.compile.

Each is a TrainConfig key (`kernels`, `compile`; `pack_length` lives in the packing itself) and each
falls back to the plain path where it cannot run, with a line in the worker's log that says why,
so a preset that sets one for a GPU still runs on a CPU laptop. bench/gpu_checks/levers.py measures
each on a GPU (tokens/s, MFU, peak memory, and the first step's loss against the plain path's).
"""

from __future__ import annotations

import importlib.util
import shutil

import torch

from train.config import TrainConfig

LIGER_MODELS = ("llama",)  # model types whose modules Liger's patch for Llama fits (its norms, MLP and rotary)


def kernels_unavailable(model, device: torch.device) -> str | None:
    """Why Liger's kernels cannot run for `model` on `device`; None when they can."""
    if device.type != "cuda":
        return "they are Triton kernels for CUDA and this worker has no GPU"
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (the gpu extra installs it)"
    model_type = getattr(model.config, "model_type", None)
    if model_type not in LIGER_MODELS:
        return f"model type {model_type!r} is not one of {list(LIGER_MODELS)}"
    return None


def use_kernels(model, cfg: TrainConfig, device: torch.device) -> str:
    """With `kernels: liger`, Liger's RMSNorm, SwiGLU, rotary embedding and fused linear
    cross-entropy (with labels, the loss without materialising the logits; without labels, as
    logit_kl asks, the plain logits) in `model`'s modules, before any adapter is attached. Returns
    the log line saying what runs."""
    if cfg.kernels == "none":
        return "kernels: plain"
    if (why := kernels_unavailable(model, device)) is not None:
        return f"kernels: liger asked for, the plain path runs: {why}"
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(
        rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True, model=model
    )
    return "kernels: liger (RMSNorm, SwiGLU, RoPE, fused linear cross-entropy)"


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run here; None when it can (Inductor needs a C++ compiler on CPU)."""
    if device.type == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
        return "Inductor compiles CPU kernels with a C++ compiler and none is on PATH"
    return None


def decoder_layers(model) -> list:
    """The repeated blocks of `model` (its `_no_split_modules` types), inside any wrapper."""
    inner = model.module if hasattr(model, "module") else model
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    kinds = set(getattr(base, "_no_split_modules", None) or [])
    return [m for m in inner.modules() if type(m).__name__ in kinds]


def use_compile(model, cfg: TrainConfig, device: torch.device) -> str:
    """With `compile: true`, each decoder layer of `model` compiled in place (nn.Module.compile:
    modules, state dict and any DDP or FSDP wrapper stay as they are). Layer by layer, as PyTorch's
    regional compilation does: the layers share one compiled graph, so an 8B model compiles in
    seconds rather than minutes; shapes that vary between micro-batches are recompiled once, then
    traced dynamically. Returns the log line saying what runs."""
    if not cfg.compile:
        return "compile: off"
    if (why := compile_unavailable(device)) is not None:
        return f"compile asked for, eager runs: {why}"
    layers = decoder_layers(model)
    if not layers:
        return "compile asked for, eager runs: found no decoder layers to compile"
    for layer in layers:
        layer.compile()
    return f"compile: torch.compile (Inductor), {len(layers)} decoder layers"
