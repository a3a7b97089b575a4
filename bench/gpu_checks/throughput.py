"""`8b_lora`: LoRA training speed and memory of a full-depth Llama-3.1-8B-sized model.

Why: the pipeline's time and memory plan (docs/scaling.md) assumes an MFU and an activation size
per token for 8B; a 2-layer model cannot give them (its parameters are mostly the vocabulary, and
MFU counted over them comes out about 1.5x). Here all 32 layers train, through the trainer's own
load_base / attach_lora / pack_batch / forward_loss / make_optimizer, on packed micro-batches of the
presets' shapes, each repeated for a few optimizer steps (the loss must fall). Figures per shape:
tokens/s, MFU (4 x parameters x tokens/s over the GPU's bf16 peak) with and without the
embedding and lm_head parameters (the lm_head's matmul is real work, the embedding lookup is not:
the truth lies between), peak memory, and the SDPA kernel PyTorch dispatched to.
"""

from __future__ import annotations

from train.model import count_parameters
from train.step import make_optimizer, peak_flops

from .shared import Context, clock, optimizer_step, packed, peak_gib, reset_peak, sdpa_backends, shape_rows

WARMUP = 2  # steps that pay for kernel selection and the optimizer state's allocation


def check_8b_lora(ctx: Context, model, steps: int) -> dict:
    cfg = ctx.cfg()
    model.train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg, ctx.device)
    n_params, n_trained = count_parameters(model)
    embeddings = {id(m.weight): m.weight.numel() for m in (model.get_input_embeddings(), model.get_output_embeddings())}
    n_matmul = n_params - sum(embeddings.values())
    peak = peak_flops(ctx.device)
    teacher = ctx.shapes["teacher"]
    # every row full: the memory plan's bound
    full = {**teacher, "shortest": teacher["max_length"], "longest": teacher["max_length"]}
    shapes = {**ctx.shapes, "teacher_full_rows": full}
    out = {
        "parameters": n_params,
        "parameters_without_embeddings": n_matmul,
        "trained_parameters": n_trained,
        "attention": model.config._attn_implementation,
        "lr": cfg.lr,
        "steps": steps,
        "sdpa_backends_enabled": sdpa_flags(),
        "shapes": {},
    }
    for seed, (name, shape) in enumerate(shapes.items()):
        batch = packed(shape_rows(shape, model.config.vocab_size, seed), shape["max_length"], model, ctx.device)
        with sdpa_backends() as kernels:
            losses = [optimizer_step(model, opt, None, [batch], cfg)]
        losses += [optimizer_step(model, opt, None, [batch], cfg) for _ in range(WARMUP - 1)]
        reset_peak(ctx.device)
        started = clock(ctx.device)
        losses += [optimizer_step(model, opt, None, [batch], cfg) for _ in range(steps)]
        seconds = clock(ctx.device) - started
        tokens_per_s = int(batch["real_tokens"]) * steps / seconds
        out["shapes"][name] = {
            **shape,
            "packed_rows": int(batch["input_ids"].shape[0]),
            "real_tokens": int(batch["real_tokens"]),
            "padding_fraction": 1 - int(batch["real_tokens"]) / int(batch["total_tokens"]),
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "step_s": seconds / steps,
            "tokens_per_s": tokens_per_s,
            "mfu": 4 * n_params * tokens_per_s / peak if peak else None,
            "mfu_without_embeddings": 4 * n_matmul * tokens_per_s / peak if peak else None,
            "peak_memory_gib": peak_gib(ctx.device),
            "sdpa_kernels": sorted(map(str, kernels)),
        }
    out["ok"] = all(s["last_loss"] < s["first_loss"] for s in out["shapes"].values())
    return out


def sdpa_flags() -> dict:
    """Which SDPA kernels PyTorch may pick from (torch.backends.cuda), beside the one it did pick."""
    import torch

    b = torch.backends.cuda
    return {
        "flash": b.flash_sdp_enabled(),
        "efficient": b.mem_efficient_sdp_enabled(),
        "cudnn": b.cudnn_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }
