"""The training loop every Ray Train worker runs: one loop for DDP and FSDP, LoRA and full fine-tuning,
one job or several.

A LoRA worker loads the frozen base once, then trains the run's jobs one after
another over it: attach a fresh LoRA adapter (seeded exactly as a run of that
job alone would be), stream the job's own dataset shard, take optimizer steps (AdamW or SGD) with
gradient accumulation and clipping under a warmup + decay schedule, save the
adapter, remove its layers, go on to the next job. Under `method: full` the
same steps train every weight of a base loaded afresh for each job, and save a
model folder. Every `log_every` steps the
workers average their metrics over the cluster, rank 0 sets them as Ray
metrics tagged with the job and prints one progress line (`[train] <job>: step
k/n, loss, tokens/s`: the run's progress in the job log, where Ray Train's own
per-report lines are turned off); every `checkpoint_every` steps (and at each
job's end) all workers call `ray.train.report` with those metrics and a
checkpoint (train/outputs.py). A report is a barrier across the workers, about
0.3-0.7 s on 2 CPU cores: one every 10 steps of 0.06 s cost a 300-step job
more time than its training. The loss of
every optimizer step (over all workers) is kept, in each checkpoint too, and
written with the adapter's final metrics as `loss_history`. A restarted or re-run worker
group skips the jobs the checkpoint lists as done and resumes the current one,
skipping the batches it already used.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from train.config import TrainConfig, build
from train.data import TEACHER_COLUMN
from train.distill import kl_loss
from train.model import (
    adapter_hash,
    attach_lora,
    autocast_for,
    count_parameters,
    detach_lora,
    freeze_a_at,
    load_base,
    packs_into_one_row,
    trainable_state,
    unwrap,
    wrap_distributed,
)
from train.outputs import finalize, read_state, restore, staging_dir, write_checkpoint, write_snapshot

# Dense bf16 peak FLOP/s per GPU, for the MFU estimate (None: unknown device, no MFU).
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}
EPOCH_CACHE_TOKENS = 4_000_000  # rows x max_length up to which a worker keeps its shard's batches between epochs
GAUGES = ("loss", "lr", "tokens_per_s", "padding_fraction", "step_time_s", "gpu_mem_gib", "mfu")


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


def progress(line: str) -> None:
    """One line to the job log. Not `print`: Ray Train 2.60 patches it in its workers to log through
    the root logger as well as print, and the line would reach the job log twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def quiet_report_lines() -> None:
    """Ray Train 2.60 logs "Reporting training result ..." at INFO for every report of every worker
    through a logger named after its source file, outside `ray.train`, which its LoggingConfig
    (train/trainer.py) does not reach: that logger's level, here in the worker that logs it."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def forward_loss(model, batch: dict, number_ids: torch.Tensor | None = None) -> torch.Tensor:
    """One packed micro-batch's loss: next-token cross-entropy on its labels, or, with
    `number_ids` (logit_kl), the KL to the teacher's distributions over them that the batch
    carries (train/distill.py). A batch whose rows were all dropped has no labels: its zero
    loss still touches the graph, which keeps DDP's collectives in step."""
    has_labels = bool((batch["labels"] != -100).any())
    with autocast_for(next(unwrap(model).parameters()).device):
        if number_ids is not None:
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        else:
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"])
    if not has_labels:
        return out.logits.sum() * 0.0
    if number_ids is not None:
        return kl_loss(out.logits, batch[TEACHER_COLUMN], batch["labels"], number_ids)
    return out.loss


def train_loop(config: dict) -> None:
    """Ray Train entry point (train_loop_per_worker); `config` is built by trainer.train_lora_many."""
    import ray.train
    import ray.train.torch
    from ray.util.metrics import Gauge

    quiet_report_lines()
    jobs = config["jobs"]
    shared = build(TrainConfig, jobs[0]["train"], "train")  # jobs agree on what the worker group shares
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # Ray metrics (dashboard Metrics view / Prometheus), beside the reports in the Train view.
    # Tagged "adapter", not "job": Prometheus owns the "job" label (its scrape job) and renames ours.
    gauges = {key: Gauge(f"lora_train_{key}", description=f"LoRA training {key}", tag_keys=("run", "adapter")) for key in GAUGES}

    lora = shared.method == "lora"  # else each job trains a base of its own, every weight
    base = load_base(config["model_path"], shared, device) if lora else None
    checkpoint = ray.train.get_checkpoint()
    state = read_state(checkpoint, jobs[0]["name"])
    done = list(state["done"])
    for i, job in enumerate(jobs):
        if job["name"] in done:
            continue
        resume = checkpoint if state["job"] == job["name"] else None
        cfg = build(TrainConfig, job["train"], "train")
        model = attach_lora(base, cfg) if lora else load_base(config["model_path"], cfg, device)
        train_job(model, job, config, resume, done, gauges)
        done.append(job["name"])
        if lora and i < len(jobs) - 1:
            base = detach_lora(model)
        del model  # a fully fine-tuned model is freed before the next job loads its own


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


def apply_step(params: list, opt, max_grad_norm: float) -> None:
    """The optimizer step once a step's gradients are accumulated: clip, step, clear."""
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)


def train_job(model, job: dict, config: dict, checkpoint, done: list[str], gauges: dict) -> None:
    """Train one adapter (already attached to the base), or one whole model, to its last step and
    write its output folder.

    `checkpoint` is the run's latest checkpoint when it belongs to this job, else None;
    `done` lists the jobs finished before this one (recorded in every checkpoint).
    """
    import ray.train
    import ray.train.torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from train.collate import PackBatch

    cfg = build(TrainConfig, job["train"], "train")
    name, total, micro_per_epoch = job["name"], job["total_steps"], job["micro_steps_per_epoch"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if job.get("init_a_from"):  # lora_init teacher_a: A frozen at the teacher's, B trains
        freeze_a_at(model, job["init_a_from"])
    # Before any restore: the LoRA init this adapter started from (a full model starts from the base itself).
    init_hash = adapter_hash(model) if cfg.method == "lora" else None
    optim_state = sched_state = None
    if checkpoint is not None:
        optim_state, sched_state = restore(model, checkpoint)
    resumed = read_state(checkpoint, name)
    step, history = resumed["step"], resumed["loss_history"]  # history: [step, loss] per optimizer step so far
    resumed_from = step if checkpoint is not None else None
    n_params, _ = count_parameters(model)
    distil = job.get("teacher") is not None  # logit_kl: the batches carry the teacher's targets
    number_ids = torch.tensor(config["number_ids"], device=device) if distil else None
    model = wrap_distributed(model, cfg, device)
    torch.manual_seed(cfg.seed)  # dropout: the same stream alone or after other jobs
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(lr_factor, total=total, cfg=cfg))
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optim_state is not None:
        set_optimizer_state_dict(model, opt, optim_state, options=full)
        sched.load_state_dict(sched_state)

    micro = step * cfg.grad_accum
    shard = ray.train.get_dataset_shard(name)
    collate = PackBatch(cfg.max_length, config["pad_id"], packs_into_one_row(unwrap(model)))
    flops_peak = peak_flops(device)
    staging = staging_dir(Path(job["output_dir"]), config["run_id"])
    # Kept on the device (no per-step host sync) and all-reduced at each report.
    window = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, micro-steps, real tokens, all tokens
    step_losses: list[torch.Tensor] = []  # per optimizer step since the last report: [loss sum, micro-steps]
    one = torch.ones((), dtype=torch.float64, device=device)
    window_start, window_steps, first_loss, last = time.time(), 0, None, {}
    if rank == 0 and resumed_from is not None:
        progress(f"[train] {name}: resumed from the checkpoint at step {resumed_from}/{total}")

    def report(save: bool) -> dict:
        nonlocal window, window_start, window_steps, first_loss
        per_step = torch.stack(step_losses) if step_losses else window.new_zeros((0, 2))
        summed = torch.cat([window, per_step.flatten()])  # one collective for both
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(summed)
        window, per_step = summed[:4], summed[4:].view(-1, 2)
        elapsed = time.time() - window_start
        loss_sum, n_micro, real_tokens, all_tokens = window.tolist()
        history.extend([s, total_loss / count] for s, (total_loss, count) in zip(range(step - len(per_step) + 1, step + 1), per_step.tolist()))
        step_losses.clear()
        loss = loss_sum / n_micro if n_micro else None  # None: no steps since the last report
        first_loss = loss if first_loss is None else first_loss
        metrics = {
            "job": name,
            "step": step,
            "epoch": micro // micro_per_epoch,
            "loss": loss,
            "lr": sched.get_last_lr()[0],
            "tokens_per_s": real_tokens / elapsed,
            "padding_fraction": 1.0 - real_tokens / max(all_tokens, 1.0),
            "step_time_s": elapsed / max(window_steps, 1),
            "first_loss": first_loss,
            "resumed_from_step": resumed_from,
            "init_hash": init_hash,
            "done": step >= total,
        }
        if device.type == "cuda":
            metrics["gpu_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            if flops_peak:  # forward 2N + activation gradients 2N per token, + weight gradients 2N under full fine-tuning
                metrics["mfu"] = (6 if cfg.method == "full" else 4) * n_params * metrics["tokens_per_s"] / (flops_peak * world)
        if rank == 0:
            for key, gauge in gauges.items():
                if metrics.get(key) is not None:
                    gauge.set(metrics[key], tags={"run": ctx.get_experiment_name(), "adapter": name})
            if loss is not None:
                progress(f"[train] {name}: step {step}/{total}, loss {loss:.3f}, {metrics['tokens_per_s']:.0f} tokens/s")
        if save:  # ray.train.report is a barrier across the workers (0.3-0.7 s on 2 CPUs): with checkpoints only
            with tempfile.TemporaryDirectory() as tmp:
                weights = trainable_state(model)  # collective under FSDP
                optim = get_optimizer_state_dict(model, opt, options=full)
                ckpt = None
                if rank == 0:
                    state = {"done": done, "job": name, "step": step, "loss_history": history}
                    write_checkpoint(Path(tmp), model, weights, optim, sched.state_dict(), state)
                    ckpt = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report(metrics, checkpoint=ckpt)
        window = torch.zeros_like(window)
        window_start, window_steps = time.time(), 0
        return metrics

    model.train()
    reported_final = False
    # Every epoch reads the shard in the same order; a small one is kept after its first full
    # pass, so later epochs skip restarting Ray Data's pipeline (seconds each on small CPU runs).
    keep = job["facts"]["rows"] * cfg.max_length <= EPOCH_CACHE_TOKENS
    epoch: list | None = None
    while step < total:
        skip = micro % micro_per_epoch
        batches = epoch if epoch is not None else shard.iter_torch_batches(batch_size=cfg.batch_size, collate_fn=collate, drop_last=True)
        seen = []
        for i, batch in enumerate(batches):
            if keep and epoch is None:
                seen.append(batch)
                if len(seen) == micro_per_epoch:
                    epoch = seen
            if i >= micro_per_epoch or step >= total:
                break
            if i < skip:  # resumed mid-epoch: these batches were trained before the checkpoint
                continue
            last_micro = (micro + 1) % cfg.grad_accum == 0
            loss = accumulate(model, batch, cfg.grad_accum, last_micro, number_ids)
            window += torch.stack([loss.double(), one, batch["real_tokens"].double(), batch["total_tokens"].double()])
            if micro % cfg.grad_accum == 0:  # the first micro-step of an optimizer step
                step_losses.append(torch.zeros(2, dtype=torch.float64, device=device))
            step_losses[-1] += torch.stack([loss.double(), one])
            micro += 1
            if not last_micro:
                continue
            apply_step(params, opt, cfg.max_grad_norm)
            sched.step()
            step += 1
            window_steps += 1
            if step in job["snapshot_steps"] and step < total:  # the final one is written with the adapter
                weights = trainable_state(model)  # collective under FSDP
                if rank == 0:
                    write_snapshot(staging, step, model, weights)
            save = step % cfg.checkpoint_every == 0 or step == total
            if save or step % cfg.log_every == 0:
                last = report(save)
                reported_final = step == total
    if not reported_final:  # e.g. resumed from the job's final checkpoint: report it again
        last = report(save=True)

    weights = trainable_state(model)  # collective under FSDP
    if rank == 0:
        metrics = {**last, **job["facts"], "loss_history": history}
        finalize(Path(job["output_dir"]), config["run_id"], unwrap(model), weights, metrics, bool(job["snapshot_steps"]))
