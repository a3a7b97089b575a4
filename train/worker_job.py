"""A job on a Ray Train worker: what the driver hands every worker (`WorkerJob`, in a `WorkerRun`:
train/trainer.py builds them), what a worker holds while it trains one (`JobState`, with the `Window`
of metrics since the last report), how that state starts, restored from the run's latest checkpoint
when the checkpoint is this job's (`start_job`), and how it is saved into a checkpoint
(`save_checkpoint`; the files themselves: train/outputs.py).

Apart from the loop that drives them (train/loop.py), so that the loop reads as its steps, and so
that what a checkpoint is written with and what it is restored into sit side by side.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.config import TrainConfig
from train.levers import use_compile
from train.model import adapter_hash, count_parameters, freeze_a_at, trainable_state, wrap_distributed
from train.outputs import read_state, restore, write_checkpoint
from train.results import StepReport, TrainFacts
from train.step import full_state, lr_factor, make_optimizer


def progress(line: str) -> None:
    """One line to the job log. Not `print`: Ray Train 2.60 patches it in its workers to log through
    the root logger as well as print, and the line would reach the job log twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class WorkerJob:
    """One job as the driver hands it to every worker (train/trainer.py builds it)."""

    name: str  # keys its dataset shard, its checkpoints' state and its metrics
    cfg: TrainConfig
    output_dir: str
    micro_steps_per_epoch: int
    total_steps: int
    snapshot_steps: tuple[int, ...]  # optimizer steps whose adapter is kept besides the last
    facts: TrainFacts  # its rows and settings, reported with its result
    distil: bool = False  # logit_kl: its batches carry the teacher's targets
    init_a_from: str | None = None  # lora_init teacher_a: the adapter whose A it starts from, frozen
    split_by_rank: bool = False  # its rows come cut per worker, a dataset "<name>@<rank>" each (ray_run.job_datasets)


@dataclass(frozen=True)
class WorkerRun:
    """A run's jobs and what they share: `train_loop`'s one setting (config["run"]; train/loop.py)."""

    jobs: tuple[WorkerJob, ...]
    model_path: str
    pad_id: int
    run_id: str
    number_ids: tuple[int, ...] | None = None  # logit_kl: the vocabulary's number tokens


class Window:
    """The metrics since the last report, kept on the device (no host sync per step) and summed
    over the workers at each report: loss, micro-steps, real and padded tokens, and the loss of
    each optimizer step."""

    def __init__(self, device: torch.device):
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, micro-steps, real tokens, all tokens
        self.step_losses: list[torch.Tensor] = []  # per optimizer step: [loss sum, micro-steps]
        self.step_norms: list[torch.Tensor] = []  # per optimizer step: the gradients' norm before clipping
        # per optimizer step: (wall-clock time it ended, its learning rate)
        self.step_marks: list[tuple[float, float]] = []
        self.one = torch.ones((), dtype=torch.float64, device=device)
        self.restart()

    def restart(self) -> None:
        self.sums.zero_()
        self.step_losses.clear()
        self.step_norms.clear()
        self.step_marks.clear()
        self.started, self.steps = time.time(), 0

    def end_step(self, grad_norm: torch.Tensor, lr: float) -> None:
        self.step_norms.append(grad_norm.detach().double())
        self.step_marks.append((time.time(), lr))
        self.steps += 1

    def add(self, loss: torch.Tensor, batch: dict, first_micro: bool) -> None:
        """One micro-step's loss and tokens; `first_micro` opens a new optimizer step."""
        self.sums += torch.stack(
            [loss.double(), self.one, batch["real_tokens"].double(), batch["total_tokens"].double()]
        )
        if first_micro:
            self.step_losses.append(torch.zeros(2, dtype=torch.float64, device=self.sums.device))
        self.step_losses[-1] += torch.stack([loss.double(), self.one])

    def collect(self) -> tuple[list[float], list[list[float]], list[list[float]], float]:
        """(the four sums, [loss sum, micro-steps] per optimizer step, [time, lr, gradient norm] per
        optimizer step, seconds) since the last restart; the sums over the workers in one collective
        (the norm is the same on every worker: it is taken after gradients are synchronised)."""
        per_step = torch.stack(self.step_losses) if self.step_losses else self.sums.new_zeros((0, 2))
        summed = torch.cat([self.sums, per_step.flatten()])
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(summed)
        norms = torch.stack(self.step_norms).tolist() if self.step_norms else []
        marks = [[at, lr, norm] for (at, lr), norm in zip(self.step_marks, norms)]
        return summed[:4].tolist(), summed[4:].view(-1, 2).tolist(), marks, time.time() - self.started


@dataclass
class JobState:
    """One job in training on one worker: what it trains with, and where it stands."""

    model: Any
    opt: torch.optim.Optimizer
    sched: Any
    params: list
    device: torch.device
    rank: int
    world: int
    run_name: str
    step: int
    micro: int
    history: list  # [step, loss] per optimizer step so far
    # [step, wall-clock time, learning rate, gradient norm before clipping] per optimizer step so far
    step_history: list
    resumed_from: int | None
    init_hash: str | None
    n_params: int
    number_ids: torch.Tensor | None
    window: Window
    first_loss: float | None = None


def start_job(model, job: WorkerJob, run: WorkerRun, checkpoint) -> JobState:
    """The model wrapped for the worker group, its optimizer and schedule, restored from
    `checkpoint` (the run's latest, when it belongs to this job)."""
    import ray.train
    import ray.train.torch
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    cfg, device, ctx = job.cfg, ray.train.torch.get_device(), ray.train.get_context()
    if job.init_a_from:  # lora_init teacher_a: A frozen at the teacher's, B trains
        freeze_a_at(model, job.init_a_from)
    # Before any restore: the LoRA init this adapter started from (a full model starts from the base itself).
    init_hash = adapter_hash(model) if cfg.method == "lora" else None
    optim_state = sched_state = None
    if checkpoint is not None:
        optim_state, sched_state = restore(model, checkpoint)
    resumed = read_state(checkpoint, job.name)
    n_params, _ = count_parameters(model)
    model = wrap_distributed(model, cfg, device)
    if cfg.compile and (note := use_compile(model, cfg, device)) and ctx.get_world_rank() == 0:
        progress(f"[train] {job.name}: {note}")
    torch.manual_seed(cfg.seed)  # dropout: the same stream alone or after other jobs
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(lr_factor, total=job.total_steps, cfg=cfg))
    if optim_state is not None:
        set_optimizer_state_dict(model, opt, optim_state, options=full_state())
        sched.load_state_dict(sched_state)
    step = resumed["step"]
    return JobState(
        model=model,
        opt=opt,
        sched=sched,
        params=params,
        device=device,
        rank=ctx.get_world_rank(),
        world=ctx.get_world_size(),
        run_name=ctx.get_experiment_name(),
        step=step,
        micro=step * cfg.grad_accum,
        history=resumed["loss_history"],
        step_history=resumed["step_history"],
        resumed_from=step if checkpoint is not None else None,
        init_hash=init_hash,
        n_params=n_params,
        number_ids=torch.tensor(run.number_ids, device=device) if job.distil else None,
        window=Window(device),
    )


def save_checkpoint(t: JobState, job: WorkerJob, metrics: StepReport, done: list[str]) -> None:
    """Every worker reports `metrics`; rank 0 with a checkpoint of the weights, optimizer, schedule and state."""
    import ray.train
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with tempfile.TemporaryDirectory() as tmp:
        weights = trainable_state(t.model)  # collective under FSDP
        optim = get_optimizer_state_dict(t.model, t.opt, options=full_state())
        ckpt = None
        if t.rank == 0:
            state = {
                "done": done,
                "job": job.name,
                "step": t.step,
                "loss_history": t.history,
                "step_history": t.step_history,
            }
            write_checkpoint(Path(tmp), t.model, weights, optim, t.sched.state_dict(), state)
            ckpt = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics.metrics(), checkpoint=ckpt)
