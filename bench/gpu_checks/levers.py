"""`8b_levers`: the trainer's throughput levers at full 8B depth, each alone and all together.

Why: LoRA through the trainer reached MFU 0.25-0.28 at the presets' packed shapes on an H100, and
published LoRA fine-tuning goes 1.5-2x faster with packing, fused kernels and compilation. Each
lever is a TrainConfig key the presets can set (train/levers.py): `pack_length` (a micro-step's
rows packed into fewer, longer sequences, so less padding), `kernels: liger` (Triton RMSNorm,
SwiGLU, RoPE and a cross-entropy fused with the lm_head), `compile` (torch.compile), and a larger
`batch_size` (twice the rows a micro-step, where memory allows). Per shape and variant: tokens/s,
MFU, peak memory, the SDPA kernel, and the loss of the same rows at the same weights against the
plain path's (packing, kernels and compilation change rounding, not the loss; the larger
micro-step trains other rows and is not compared). Every variant starts from the same LoRA
weights with a fresh optimizer. Liger patches the model's modules in place, so its variants come
last. In --smoke (CPU) Liger falls back to the plain path, as the trainer does, and the compiled
variants are skipped (tests/train/test_levers.py compiles on CPU).
"""

from __future__ import annotations

import time

import torch

from train.levers import decoder_layers, use_compile, use_kernels
from train.model import count_parameters
from train.step import forward_loss, make_optimizer, peak_flops

from .shared import Context, clock, optimizer_step, packed, peak_gib, reset_peak, sdpa_backends, shape_rows

WARMUP = 2  # steps that pay for kernel selection, the optimizer state's allocation and compilation
PACK_LENGTH = 4096  # every row of a preset's micro-step fits one sequence
VARIANTS = {  # name -> (TrainConfig overrides, rows a micro-step x)
    "plain": ({}, 1),
    f"pack_length {PACK_LENGTH}": ({"pack_length": PACK_LENGTH}, 1),
    "2x rows a micro-step": ({}, 2),
    "compile": ({"compile": True}, 1),
    "liger": ({"kernels": "liger"}, 1),
    "liger + compile": ({"kernels": "liger", "compile": True}, 1),
    "all": ({"kernels": "liger", "compile": True, "pack_length": PACK_LENGTH}, 2),
}


def check_levers(ctx: Context, model, steps: int, only: list[str] | None = None) -> dict:
    """Every variant of VARIANTS (or `only` those, with plain), in its order, on `model` (a PeftModel)."""
    if unknown := sorted(set(only or ()) - set(VARIANTS)):
        raise ValueError(f"unknown lever variants {unknown}; known: {list(VARIANTS)}")
    n_params, _ = count_parameters(model)
    peak = peak_flops(ctx.device)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    loss_tol = ctx.tolerance(2e-2, 1e-4)  # relative; bf16 over 32 layers (the packing check's bound) vs float32
    out = {"parameters": n_params, "loss_tolerance": loss_tol, "pack_length": PACK_LENGTH, "variants": {}}
    patched = False
    for name, (overrides, factor) in VARIANTS.items():
        if only and name != "plain" and name not in only:
            continue
        cfg = ctx.cfg(**overrides)
        if cfg.compile and ctx.smoke:
            out["variants"][name] = {
                "ok": None,
                "skipped": "compilation on CPU is tested in tests/train/test_levers.py",
            }
            continue
        if cfg.kernels == "liger" and not patched:
            out["kernels"] = use_kernels(model.get_base_model(), cfg, ctx.device)
            patched = True
        compiled = use_compile(model, cfg, ctx.device) if cfg.compile else None
        started = time.time()
        try:
            shapes = {
                shape: measure(ctx, model, cfg, initial, shape, factor, steps, n_params, peak) for shape in ctx.shapes
            }
        finally:
            if cfg.compile:
                for layer in decoder_layers(model):
                    layer._compiled_call_impl = None  # nn.Module.compile's own attribute: eager again
                torch._dynamo.reset()
        out["variants"][name] = {
            "overrides": overrides,
            "rows_factor": factor,
            "compile": compiled,
            "shapes": shapes,
            "seconds": round(time.time() - started, 1),
        }
        line = ", ".join(
            f"{s}: {v['tokens_per_s']:.0f} tokens/s, MFU {v['mfu'] or 0:.3f}, {v['peak_memory_gib'] or 0:.1f} GiB"
            for s, v in shapes.items()
        )
        print(f"  8b_levers {name}: {line}", flush=True)
    plain = out["variants"]["plain"]["shapes"]
    for variant in out["variants"].values():
        for shape, v in variant.get("shapes", {}).items():
            v["loss_gap"] = (
                None
                if variant["rows_factor"] != 1
                else abs(v["loss_at_start"] - plain[shape]["loss_at_start"]) / plain[shape]["loss_at_start"]
            )
            v["speedup"] = v["tokens_per_s"] / plain[shape]["tokens_per_s"]
            v["ok"] = v["last_loss"] < v["first_loss"] and (v["loss_gap"] is None or v["loss_gap"] <= loss_tol)
        if "shapes" in variant:
            variant["ok"] = all(v["ok"] for v in variant["shapes"].values())
    out["ok"] = all(v["ok"] is not False for v in out["variants"].values())
    return out


def measure(
    ctx: Context, model, cfg, initial: dict, shape_name: str, factor: int, steps: int, n_params: int, peak
) -> dict:
    """One shape under one variant: the loss at the initial weights, then WARMUP + `steps` optimizer steps."""
    shape = {**ctx.shapes[shape_name], "rows": ctx.shapes[shape_name]["rows"] * factor}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in initial:
                p.copy_(initial[n])
    seed = list(ctx.shapes).index(shape_name)
    batch = packed(
        shape_rows(shape, model.config.vocab_size, seed), cfg.pack_length or shape["max_length"], model, ctx.device
    )
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg, ctx.device)
    model.train()
    with torch.no_grad():
        loss_at_start = float(forward_loss(model, batch))
    with sdpa_backends() as kernels:
        losses = [optimizer_step(model, opt, None, [batch], cfg) for _ in range(WARMUP)]
    reset_peak(ctx.device)
    started = clock(ctx.device)
    losses += [optimizer_step(model, opt, None, [batch], cfg) for _ in range(steps)]
    seconds = clock(ctx.device) - started
    tokens_per_s = int(batch["real_tokens"]) * steps / seconds
    return {
        "rows": shape["rows"],
        "packed_rows": int(batch["input_ids"].shape[0]),
        "real_tokens": int(batch["real_tokens"]),
        "padding_fraction": 1 - int(batch["real_tokens"]) / int(batch["total_tokens"]),
        "loss_at_start": loss_at_start,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "step_s": seconds / steps,
        "tokens_per_s": tokens_per_s,
        "mfu": 4 * n_params * tokens_per_s / peak if peak else None,
        "peak_memory_gib": peak_gib(ctx.device),
        "sdpa_kernels": sorted(map(str, kernels)),
    }
