"""The training loop every Ray Train worker runs: one loop for DDP and FSDP.

Each worker streams its shard of the tokenized cache, packs batches, and takes
AdamW steps with gradient accumulation and clipping under a warmup + decay
schedule. Every `log_every` steps all workers call `ray.train.report` with
metrics averaged over the cluster; every `checkpoint_every` steps (and at the
end) the report carries a checkpoint: the adapter, the full trainable weights,
the optimizer and scheduler state and the step. A restarted or re-run worker
group resumes from the latest checkpoint and skips the batches it already used.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from train.config import TrainConfig, build
from train.data import pack_batch
from train.model import (
    count_parameters,
    load_lora_model,
    save_adapter,
    trainable_state,
    wrap_distributed,
)

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


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def _load_checkpoint(model, checkpoint) -> tuple[dict, dict | None, dict | None]:
    """Restore trainable weights into the unwrapped model; return (state, optimizer, scheduler) dicts."""
    if checkpoint is None:
        return {"step": 0}, None, None
    with checkpoint.as_directory() as d:
        d = Path(d)
        weights = torch.load(d / "trainable.pt", map_location="cpu", weights_only=True)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        if set(weights) != trainable:
            raise RuntimeError(f"checkpoint {d} does not match the model's adapter: {sorted(set(weights) ^ trainable)[:3]}")
        model.load_state_dict(weights, strict=False)
        optim = torch.load(d / "optimizer.pt", map_location="cpu", weights_only=False)
        state = json.loads((d / "state.json").read_text())
    return state, optim["optimizer"], optim["scheduler"]


def train_loop(config: dict) -> None:
    """Ray Train entry point (train_loop_per_worker); `config` is built by trainer.train_lora."""
    import ray.train
    import ray.train.torch
    from ray.util.metrics import Gauge
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    cfg = build(TrainConfig, config["train"], "train")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)

    model = load_lora_model(config["model_path"], cfg, device)
    checkpoint = ray.train.get_checkpoint()
    state, optim_state, sched_state = _load_checkpoint(model, checkpoint)
    resumed_from = state["step"] if checkpoint else None
    n_params, _ = count_parameters(model)
    model = wrap_distributed(model, cfg, device)

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=device.type == "cuda")
    total = config["total_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(lr_factor, total=total, cfg=cfg))
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optim_state is not None:
        set_optimizer_state_dict(model, opt, optim_state, options=full)
        sched.load_state_dict(sched_state)

    fsdp = cfg.strategy == "fsdp" and hasattr(model, "set_requires_gradient_sync")
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    micro_per_epoch = config["micro_steps_per_epoch"]
    step = state["step"]
    micro = step * cfg.grad_accum
    shard = ray.train.get_dataset_shard("train")
    collate = functools.partial(pack_batch, max_length=cfg.max_length, pad_id=config["pad_id"])
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    flops_peak = peak_flops(device)
    # Ray metrics (dashboard Metrics view / Prometheus), beside the reports in the Train view.
    gauges = {
        key: Gauge(f"lora_train_{key}", description=f"LoRA training {key}", tag_keys=("run",))
        for key in ("loss", "lr", "tokens_per_s", "padding_fraction", "step_time_s", "gpu_mem_gib", "mfu")
    }
    # Kept on the device (no per-step host sync) and all-reduced at each report.
    window = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, micro-steps, real tokens, all tokens
    one = torch.ones((), dtype=torch.float64, device=device)
    window_start, window_steps, first_loss = time.time(), 0, None

    def checkpoint_dir(tmp: str, weights: dict, optim: dict) -> "ray.train.Checkpoint":
        d = Path(tmp)
        save_adapter(model, weights, d / "adapter")
        torch.save(weights, d / "trainable.pt")
        torch.save({"optimizer": optim, "scheduler": sched.state_dict()}, d / "optimizer.pt")
        (d / "state.json").write_text(json.dumps({"step": step}))
        return ray.train.Checkpoint.from_directory(tmp)

    def report(save: bool) -> None:
        nonlocal window, window_start, window_steps, first_loss
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(window)
        elapsed = time.time() - window_start
        loss_sum, n_micro, real_tokens, all_tokens = window.tolist()
        loss = loss_sum / n_micro if n_micro else None  # None: no steps since the last report
        first_loss = loss if first_loss is None else first_loss
        metrics = {
            "step": step,
            "epoch": micro // micro_per_epoch,
            "loss": loss,
            "lr": sched.get_last_lr()[0],
            "tokens_per_s": real_tokens / elapsed,
            "padding_fraction": 1.0 - real_tokens / max(all_tokens, 1.0),
            "step_time_s": elapsed / max(window_steps, 1),
            "first_loss": first_loss,
            "resumed_from_step": resumed_from,
            "done": step >= total,
        }
        if device.type == "cuda":
            metrics["gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if flops_peak:  # LoRA: forward 2N + activation gradients 2N per token, no base weight gradients
                metrics["mfu"] = 4 * n_params * metrics["tokens_per_s"] / (flops_peak * world)
        if rank == 0:
            for key, gauge in gauges.items():
                if metrics.get(key) is not None:
                    gauge.set(metrics[key], tags={"run": ctx.get_experiment_name()})
        ckpt = None
        with tempfile.TemporaryDirectory() as tmp:
            if save:
                weights = trainable_state(model)  # collective under FSDP
                optim = get_optimizer_state_dict(model, opt, options=full)
                if rank == 0:
                    ckpt = checkpoint_dir(tmp, weights, optim)
            ray.train.report(metrics, checkpoint=ckpt)
        window = torch.zeros_like(window)
        window_start, window_steps = time.time(), 0

    model.train()
    reported_final = False
    while step < total:
        skip = micro % micro_per_epoch
        for i, batch in enumerate(shard.iter_torch_batches(batch_size=cfg.batch_size, collate_fn=collate, drop_last=True)):
            if i >= micro_per_epoch or step >= total:
                break
            if i < skip:  # resumed mid-epoch: these batches were trained before the checkpoint
                continue
            last_micro = (micro + 1) % cfg.grad_accum == 0
            if fsdp:
                model.set_requires_gradient_sync(last_micro)
            sync = model.no_sync() if ddp and not last_micro else contextlib.nullcontext()
            with sync:
                with autocast:
                    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
                # A batch whose rows were all dropped has no labels: a zero loss keeps DDP's collectives in step.
                has_labels = bool((batch["labels"] != -100).any())
                loss = out.loss if has_labels else out.logits.sum() * 0.0
                (loss / cfg.grad_accum).backward()
            window += torch.stack([loss.detach().double(), one, batch["real_tokens"].double(), batch["total_tokens"].double()])
            micro += 1
            if not last_micro:
                continue
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            window_steps += 1
            if config.get("fail_at_step") == step and resumed_from is None and rank == 0:
                raise RuntimeError(f"injected failure at step {step} (test switch)")
            save = step % cfg.checkpoint_every == 0 or step == total
            if save or step % cfg.log_every == 0:
                report(save)
                reported_final = step == total
    if not reported_final:  # e.g. resumed from the final checkpoint: report it again
        report(save=True)
