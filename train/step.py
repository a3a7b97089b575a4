"""One optimizer step's pieces, shared by the training loop (train/loop.py) and the benchmarks:
the learning-rate schedule, the optimizer, a micro-batch's loss (SFT or logit KL), gradient
accumulation across the workers, and the step itself."""

from __future__ import annotations

import contextlib
import math

import torch

from train.config import TrainConfig
from train.data import TEACHER_COLUMN
from train.distill import kl_loss
from train.model import autocast_for, unwrap

# Dense bf16 peak FLOP/s per GPU, for the MFU estimate (None: unknown device, no MFU).
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def lr_factor(step: int, total: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr at optimizer step `step` (0-based): linear warmup, then decay."""
    warmup = math.ceil(cfg.warmup_ratio * total)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(params: list, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """cfg.optimizer over the trainable parameters: AdamW (fused on CUDA), or SGD with momentum."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=device.type == "cuda")


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def full_state():
    """Optimizer state gathered whole and on the CPU, as checkpoints hold it (the same under DDP and FSDP)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def forward_loss(model, batch: dict, number_ids: torch.Tensor | None = None) -> torch.Tensor:
    """One packed micro-batch's loss: next-token cross-entropy on its labels, or, with
    `number_ids` (logit_kl), the KL to the teacher's distributions over them that the batch
    carries (train/distill.py). A batch whose rows were all dropped has no labels: its zero
    loss still touches the graph, which keeps DDP's collectives in step."""
    has_labels = bool((batch["labels"] != -100).any())
    with autocast_for(next(unwrap(model).parameters()).device):
        if number_ids is not None or not has_labels:  # the logits themselves (a fused loss would not make them)
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        else:
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
    if not has_labels:
        return out.logits.sum() * 0.0
    if number_ids is not None:
        return kl_loss(out.logits, batch[TEACHER_COLUMN], batch["labels"], number_ids)
    return out.loss


def accumulate(model, batch: dict, grad_accum: int, last_micro: bool, number_ids=None) -> torch.Tensor:
    """One micro-step of an optimizer step: the forward and the backward of loss / grad_accum, the
    workers synchronising gradients only on the step's last micro-step (DDP's no_sync, FSDP2's
    set_requires_gradient_sync). Returns the micro-batch's loss, detached."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(last_micro)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    with model.no_sync() if ddp and not last_micro else contextlib.nullcontext():
        loss = forward_loss(model, batch, number_ids)
        (loss / grad_accum).backward()
    return loss.detach()


def apply_step(params: list, opt, max_grad_norm: float) -> torch.Tensor:
    """The optimizer step once a step's gradients are accumulated: clip, step, clear. Returns the
    gradients' total norm before clipping, on the device (read with the step's other figures)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
