"""The training-run setup the teacher and arms phases share: run names, groups of jobs, what is recorded.

A Ray Train run trains one group of adapter jobs over one copy of a base model
(train.trainer.train_lora_many). Its name is keyed by the inputs of the stages
it makes, so an interrupted run resumes where it stopped, and by the outputs it
replaces, so retraining a stage whose adapter was damaged starts a new run
rather than finding the old one finished.
"""

from __future__ import annotations

from pathlib import Path

from common.files import file_digest
from jobs.experiment.records import TrainedOutputs
from jobs.rundir.manifest import Manifest, digest
from jobs.runtime.context import TRAIN_STORAGE, RunContext
from train.results import TrainResult


def run_name(manifest: Manifest, prefix: str, stages) -> str:
    """`<prefix>-<digest>` of the stages' inputs and of the outputs they replace."""
    replaced = [entry["outputs"]["hash"] for stage in stages if (entry := manifest.entry(stage.name))]
    return f"{prefix}-{digest([stage.inputs(manifest) for stage in stages], *replaced)[:8]}"


def train_groups(ctx: RunContext, prefix: str, groups: list[list[tuple]], runs: int):
    """Yields (stage, TrainResult) for every job of every group, a group being [(stage, AdapterJob)] over
    one base model (`base` of its first stage: ctx.models, or the teacher's base). One
    train_lora_many call per group: in this driver when runs go one at a time, else as Ray tasks,
    `runs` at once."""
    import ray

    from jobs.runtime.handoff import wait_for_gpus
    from train.trainer import clear_stale_outputs, train_lora_many

    if any(job.cfg.use_gpu for group in groups for _, job in group):  # a Serve app's engines may still hold the GPUs
        wait_for_gpus(ctx.cfg.service.gpu_memory_utilization, prefix)

    def call(group):
        jobs = [job for _, job in group]
        kwargs = {
            "storage_path": ctx.run_dir / TRAIN_STORAGE,
            "cache_dir": ctx.cache,
            "run_name": run_name(ctx.manifest, prefix, [stage for stage, _ in group]),
        }
        clear_stale_outputs(jobs, **kwargs)
        model = ctx.models.get(group[0][0].name)
        return ctx.paths[model.base if model else "base"], jobs, kwargs

    if runs == 1:
        for group in groups:
            base, jobs, kwargs = call(group)
            results = train_lora_many(base, jobs, **kwargs)
            yield from ((stage, results[job.name]) for stage, job in group)
        return
    remote, pending = ray.remote(num_cpus=0)(train_lora_many), {}
    for group in groups:
        if len(pending) == runs:
            yield from _finished_group(pending)
        base, jobs, kwargs = call(group)
        pending[remote.remote(base, jobs, **kwargs)] = group
    while pending:
        yield from _finished_group(pending)


def _finished_group(pending: dict) -> list[tuple]:
    import ray

    (ref,), _ = ray.wait(list(pending), num_returns=1)
    group, results = pending.pop(ref), ray.get(ref)
    return [(stage, results[job.name]) for stage, job in group]


def record_trained(ctx: RunContext, stage, result: TrainResult, started: float) -> None:
    """The stage's progress line, its training run's spans (its marks: train/results.py), and its
    manifest entry: the digest of the weights it made (an adapter's file, or every weights file of a
    fully fine-tuned model) and what the report reads of its training."""
    folder: Path = ctx.trained(stage.name)
    adapter = folder / "adapter_model.safetensors"
    weights = (
        file_digest(adapter)
        if adapter.is_file()
        else digest(*(file_digest(f) for f in sorted(folder.glob("*.safetensors"))))
    )
    print(
        f"[{stage.phase}] {stage.name}: {result.step} steps, loss {result.first_loss:.3f} -> {result.loss:.3f}, on {result.device}",
        flush=True,
    )
    for kind, start, end in result.marks.spans():
        ctx.span(f"{stage.phase} run {result.run_id[:6]}", kind, start, end)
    outputs = TrainedOutputs(
        hash=weights,
        steps=result.step,
        loss=result.loss,
        init_hash=result.init_hash,
        rows=result.rows,
        snapshot_steps=result.snapshot_steps,
    )
    ctx.record(stage, started, outputs)
