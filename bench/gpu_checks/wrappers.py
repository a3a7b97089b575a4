"""`gradient_checkpointing` and `fsdp2_world_size_1`: settings that must not change the numbers.

Why: both change how the trainer computes, not what: non-reentrant gradient checkpointing
(recomputing each layer in the backward pass) must give the loss and LoRA gradients of a plain
run, and FSDP2 over one process (`strategy: fsdp`, full fine-tuning's) the loss of the bare model.
Checked on an 8B-width model of 2 layers, loaded by load_base as a worker loads it.
"""

from __future__ import annotations

import torch

from train.model import attach_lora, load_base, wrap_distributed
from train.step import forward_loss

from .shared import Context, flat_grads, packed, rel, shape_rows


def loss_and_gradients(model, batch: dict) -> tuple[float, torch.Tensor]:
    loss = forward_loss(model, batch)
    loss.backward()
    return float(loss.detach()), flat_grads(model)


def check_gradient_checkpointing(ctx: Context, model_path: str) -> dict:
    shape = ctx.shapes["teacher"]
    results = []
    for checkpointing in (False, True):
        cfg = ctx.cfg(gradient_checkpointing=checkpointing)
        model = attach_lora(load_base(model_path, cfg, ctx.device), cfg)
        model.train()  # checkpointing acts only in training mode
        with torch.no_grad():  # B is zero at init, which leaves A without gradients: give B some
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(6)).to(p) * 0.01)
        batch = packed(shape_rows(shape, model.config.vocab_size, seed=7), shape["max_length"], model, ctx.device)
        results.append(loss_and_gradients(model, batch))
        del model
    (plain_loss, plain), (loss, grads) = results
    tolerance = ctx.tolerance(2e-2, 1e-4)
    out = {"loss": loss, "plain_loss": plain_loss, "gradient_gap": rel(grads, plain), "tolerance": tolerance}
    out["ok"] = abs(loss - plain_loss) <= tolerance * abs(plain_loss) and out["gradient_gap"] <= tolerance
    return out


def check_fsdp(ctx: Context, model_path: str) -> dict:
    cfg = ctx.cfg(strategy="fsdp")
    model = attach_lora(load_base(model_path, cfg, ctx.device), cfg)
    shape = ctx.shapes["teacher"]
    batch = packed(shape_rows(shape, model.config.vocab_size, seed=8), shape["max_length"], model, ctx.device)
    with torch.no_grad():
        plain = float(forward_loss(model, batch))
        loss = float(forward_loss(wrap_distributed(model, cfg, ctx.device), batch))
    tolerance = ctx.tolerance(2e-2, 1e-5)
    return {
        "ok": abs(loss - plain) <= tolerance * abs(plain),
        "loss": loss,
        "unwrapped_loss": plain,
        "tolerance": tolerance,
    }
