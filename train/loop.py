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
checkpoint (train/outputs.py); a report is a barrier across the workers, so
only checkpoints make one (its cost: BENCHMARKS.md). The loss of
every optimizer step (over all workers) is kept, in each checkpoint too, and
written with the adapter's final metrics as `loss_history`. A restarted or re-run worker
group skips the jobs the checkpoint lists as done and resumes the current one,
skipping the batches it already used.

The pieces, in a job's order: `start_job` (the model wrapped, its optimizer and schedule, restored:
train/worker_job.py, with the job's state and `save_checkpoint`), `job_batches` (the micro-batches
still to train), `micro_step` (a step's pieces: train/step.py), `report` (the window of metrics
since the last one, and a checkpoint), the output folder last.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import psutil
import torch

from train.config import TrainConfig
from train.model import attach_lora, attention_impl, detach_lora, load_base, packs_into_one_row, trainable_state, unwrap
from train.outputs import finalize, read_state, staging_dir, write_snapshot
from train.results import Marks, StepReport, TrainResult
from train.step import accumulate, apply_step, peak_flops
from train.streams import Stream, Streams
from train.worker_job import JobState, WorkerJob, WorkerRun, progress, save_checkpoint, start_job

EPOCH_CACHE_TOKENS = 4_000_000  # rows x max_length up to which a worker keeps its shard's batches between epochs
GAUGES = ("loss", "lr", "tokens_per_s", "padding_fraction", "step_time_s", "gpu_mem_gib", "mfu")


def quiet_report_lines() -> None:
    """Ray Train 2.60 logs "Reporting training result ..." at INFO for every report of every worker
    through a logger named after its source file, outside `ray.train`, which its LoggingConfig
    (train/ray_run.py) does not reach: that logger's level, here in the worker that logs it."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop(config: dict) -> None:
    """Ray Train entry point (train_loop_per_worker); config["run"] is a WorkerRun (trainer.train_lora_many)."""
    import ray.train
    import ray.train.torch
    from ray.util.metrics import Gauge

    quiet_report_lines()
    run: WorkerRun = config["run"]
    shared = run.jobs[0].cfg  # jobs agree on what the worker group shares
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # Ray metrics (dashboard Metrics view / Prometheus), beside the reports in the Train view.
    # Tagged "adapter", not "job": Prometheus owns the "job" label (its scrape job) and renames ours.
    gauges = {
        key: Gauge(f"lora_train_{key}", description=f"LoRA training {key}", tag_keys=("run", "adapter"))
        for key in GAUGES
    }

    checkpoint = ray.train.get_checkpoint()
    state = read_state(checkpoint, run.jobs[0].name)
    done = list(state["done"])
    todo = [job for job in run.jobs if job.name not in done]
    streams = Streams(run.pad_id, packs_into_one_row(attention_impl(shared, device)))
    streams.start_ahead(todo[0] if todo else None)  # the first job's stream starts while the base loads
    # When this worker's process started and its loop began (the rest of a job's marks: train_job).
    marks = Marks(process_started=psutil.Process().create_time(), loop_started=time.time())
    lora = shared.method == "lora"  # else each job trains a base of its own, every weight
    base = load_base(run.model_path, shared, device) if lora else None
    marks = marks.at(base_loaded=time.time())
    for i, job in enumerate(todo):
        resume = checkpoint if state["job"] == job.name else None
        job_marks = marks.at(job_started=time.time())
        model = attach_lora(base, job.cfg) if lora else load_base(run.model_path, job.cfg, device)
        train_job(model, job, run, resume, done, gauges, job_marks, streams, todo[i + 1] if i + 1 < len(todo) else None)
        done.append(job.name)
        if lora and i < len(todo) - 1:
            base = detach_lora(model)
        del model  # a fully fine-tuned model is freed before the next job loads its own


def job_batches(stream: Stream, job: WorkerJob, t: JobState):
    """The micro-batches still to train, epoch after epoch in the same order, until the last step;
    a resumed job skips those trained before its checkpoint. A small shard is kept after its first
    full pass, so later epochs skip restarting Ray Data's pipeline (seconds each on small CPU runs)."""
    keep, epoch = job.facts.rows * job.cfg.max_length <= EPOCH_CACHE_TOKENS, None
    while t.step < job.total_steps:
        skip = t.micro % job.micro_steps_per_epoch
        batches = epoch if epoch is not None else stream.passes()
        seen = []
        for i, batch in enumerate(batches):
            if keep and epoch is None:
                seen.append(batch)
                if len(seen) == job.micro_steps_per_epoch:
                    epoch = seen
            if i >= job.micro_steps_per_epoch or t.step >= job.total_steps:
                break
            if i >= skip:
                yield batch


def micro_step(t: JobState, batch: dict, cfg: TrainConfig) -> bool:
    """One micro-step, and the optimizer step when it is the step's last; True when a step was taken."""
    last_micro = (t.micro + 1) % cfg.grad_accum == 0
    loss = accumulate(t.model, batch, cfg.grad_accum, last_micro, t.number_ids)
    t.window.add(loss, batch, first_micro=t.micro % cfg.grad_accum == 0)
    t.micro += 1
    if last_micro:
        lr = t.sched.get_last_lr()[0]  # the rate this step takes
        t.window.end_step(apply_step(t.params, t.opt, cfg.max_grad_norm), lr)
        t.sched.step()
        t.step += 1
    return last_micro


def report(t: JobState, job: WorkerJob, save: bool, done: list[str], gauges: dict) -> StepReport:
    """The window's metrics, summed over the workers: the loss history extended, Ray metrics set
    and one progress line (rank 0), and, with `save`, a checkpoint reported to Ray Train."""
    (loss_sum, n_micro, real_tokens, all_tokens), per_step, marks, elapsed = t.window.collect()
    steps = range(t.step - len(per_step) + 1, t.step + 1)
    t.history.extend([s, total_loss / count] for s, (total_loss, count) in zip(steps, per_step))
    t.step_history.extend([s, *mark] for s, mark in zip(steps, marks))
    loss = loss_sum / n_micro if n_micro else None  # None: no steps since the last report
    t.first_loss = loss if t.first_loss is None else t.first_loss
    tokens_per_s, gpu_mem_gib, mfu = real_tokens / elapsed, None, None
    if t.device.type == "cuda":
        gpu_mem_gib = torch.cuda.max_memory_allocated(t.device) / 2**30
        # forward 2N + activation gradients 2N per token, + weight gradients 2N under full fine-tuning
        if flops_peak := peak_flops(t.device):
            mfu = (6 if job.cfg.method == "full" else 4) * t.n_params * tokens_per_s / (flops_peak * t.world)
    metrics = StepReport(
        job=job.name,
        step=t.step,
        epoch=t.micro // job.micro_steps_per_epoch,
        loss=loss,
        lr=t.sched.get_last_lr()[0],
        tokens_per_s=tokens_per_s,
        padding_fraction=1.0 - real_tokens / max(all_tokens, 1.0),
        step_time_s=elapsed / max(t.window.steps, 1),
        first_loss=t.first_loss,
        resumed_from_step=t.resumed_from,
        init_hash=t.init_hash,
        done=t.step >= job.total_steps,
        device=t.device.type,
        gpu_mem_gib=gpu_mem_gib,
        mfu=mfu,  # device: cuda or cpu, a run that fell back to CPU says so
    )
    if t.rank == 0:
        for key, gauge in gauges.items():
            if getattr(metrics, key) is not None:
                gauge.set(getattr(metrics, key), tags={"run": t.run_name, "adapter": job.name})
        if loss is not None:
            progress(
                f"[train] {job.name}: step {t.step}/{job.total_steps}, loss {loss:.3f}, {tokens_per_s:.0f} tokens/s"
            )
    if save:  # ray.train.report is a barrier across the workers: with checkpoints only
        save_checkpoint(t, job, metrics, done)
    t.window.restart()
    return metrics


def train_job(
    model,
    job: WorkerJob,
    run: WorkerRun,
    checkpoint,
    done: list[str],
    gauges: dict,
    marks: Marks,
    streams: Streams,
    following: WorkerJob | None,
) -> None:
    """Train one adapter (already attached to the base), or one whole model, to its last step and
    write its output folder. `checkpoint` is the run's latest when it belongs to this job, else
    None; `done` lists the jobs finished before this one (recorded in every checkpoint). `marks`
    (wall-clock times: the worker's start, its base loaded, this job's start) gain the job's first
    batch, last step and save, and are written with its metrics: the run's timeline (docs/report.md).
    The `following` job's stream is started once this job's is at hand (`streams`)."""
    cfg, total = job.cfg, job.total_steps
    t = start_job(model, job, run, checkpoint)
    staging = staging_dir(Path(job.output_dir), run.run_id)
    if t.rank == 0 and t.resumed_from is not None:
        progress(f"[train] {job.name}: resumed from the checkpoint at step {t.resumed_from}/{total}")
    stream = streams.of(job)
    streams.start_ahead(following)
    t.model.train()
    last, reported_final = None, False
    for batch in job_batches(stream, job, t):
        if marks.first_batch is None:
            marks = marks.at(first_batch=time.time())
        if not micro_step(t, batch, cfg):
            continue
        if t.step in job.snapshot_steps and t.step < total:  # the final one is written with the adapter
            weights = trainable_state(t.model)  # collective under FSDP
            if t.rank == 0:
                write_snapshot(staging, t.step, t.model, weights)
        save = t.step % cfg.checkpoint_every == 0 or t.step == total
        if save or t.step % cfg.log_every == 0:
            last = report(t, job, save, done, gauges)
            reported_final = t.step == total
    if not reported_final:  # e.g. resumed from the job's final checkpoint: report it again
        last = report(t, job, save=True, done=done, gauges=gauges)
    marks = marks.at(last_step=t.step_history[-1][1] if t.step_history else time.time(), saving=time.time())
    weights = trainable_state(t.model)  # collective under FSDP
    if t.rank == 0:
        result = TrainResult.of(last, job.facts, loss_history=t.history, step_history=t.step_history, marks=marks)
        finalize(Path(job.output_dir), run.run_id, unwrap(t.model), weights, result, bool(job.snapshot_steps))
