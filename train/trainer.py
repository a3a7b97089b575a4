"""`train_lora` and `train_lora_many`: `{prompt, completion}` rows in, LoRA adapters out (or, under
`method: full`, fully fine-tuned model folders).

`train_lora_many` trains several adapters in ONE Ray Train run over one copy of
the base model per worker (train/loop.py): the base loads once, and every job
after the first saves the load, the worker start and the process group. It
validates everything that can be checked before Ray does any work (jobs agree
on what the worker group shares, model path, hardware, global batch, data
schema, output folders), tokenizes each job's rows through the cache, has the
teacher of each logit_kl job score its rows once (train/distill.py: one set of
targets per teacher and rows, shared by the jobs that read them), sizes the
workers to the cluster, and runs `TorchTrainer` with one dataset per job. Rank
0 writes each finished adapter straight into its `output_dir` through a staging
folder and a rename (train/outputs.py), so an output folder holds a finished
adapter or nothing. `train_lora` is the same run with one job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigError, to_dict
from common.files import DataError, default_cache_dir
from common.model_source import load_pretrained
from train.axes import MASKS, loss_of
from train.cluster import Capacity, auto_workers, cluster_capacity, describe
from train.config import TrainConfig, resolve_batch
from train.data import read_parquet, same_tokenizer, tokenize_to_cache
from train.distill import number_token_ids, teacher_targets
from train.divergence import divergence_scores, masked_rows
from train.loop import train_loop
from train.model import check_hardware, check_model_path
from train.outputs import finished_by, staging_dir
from train.results import Marks, TrainFacts, TrainResult
from train.teacher_pass import TeacherPass
from train.worker_job import WorkerJob, WorkerRun

# Settings of the worker group itself, which every job of a run must share (and `method`: a LoRA
# run keeps one frozen base for all its jobs, a full one loads a base of its own per job).
SHARED_KEYS = (
    "method", "num_workers", "use_gpu", "strategy", "quantization", "attention",
    "gradient_checkpointing", "kernels", "max_failures", "keep_checkpoints", "cpus_per_worker",
)  # fmt: skip
RAY_TRAIN_ENV = {  # read by the process building a trainer, which passes them on to its controller
    "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",  # the dashboard's Train view lists the run
    # The controller polls its workers this often (Ray's default 2 s): a run's end was seen 1-2 s
    # late, once per run (BENCHMARKS.md, "The pipeline's overhead").
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
}
MATERIALIZE_BYTES = 256 * 2**20  # tokenized data up to this size is read before the workers start (job_dataset)


@dataclass(frozen=True)
class AdapterJob:
    """One adapter of a `train_lora_many` run.

    `name` keys its dataset, its checkpoints' state and its reported metrics;
    `data` is a JSONL/parquet path or a Ray Dataset of `{prompt, completion}` rows.
    """

    name: str
    data: Any
    output_dir: Path
    cfg: TrainConfig
    teacher: str | None = None  # a teacher adapter folder: train by logit KL to it (train/distill.py), not SFT
    teacher_base: str | None = None  # the teacher's base when it is not this run's (a student on another base, same tokenizer)
    init_a_from: str | None = None  # an adapter folder whose LoRA A this adapter starts from, frozen (lora_init teacher_a)
    scorer: str | None = None  # mask divergence: the adapter (on this run's base) whose divergence from the base scores the rows


def worker_resources(cfg: TrainConfig, cap: Capacity) -> dict:
    """Per-worker resources that leave a CPU free for Ray Data on small clusters.

    Two workers holding both CPUs of a 2-CPU machine starve Ray Data's read tasks
    and the run hangs without an error, so CPU workers take fractional CPUs
    (cfg.cpus_per_worker when several runs share the cluster at once).
    """
    if cfg.cpus_per_worker is not None:
        resources = {"CPU": cfg.cpus_per_worker}
    else:
        resources = {"CPU": min(1.0, max(0.1, (max(cap.cpus, 1) - 1) / cfg.num_workers))}
    if cfg.use_gpu:
        if cap.max_gpus < cfg.num_workers:
            raise ConfigError(f"num_workers={cfg.num_workers} GPU workers need {cfg.num_workers} GPUs; the cluster has {describe(cap)}")
        resources["GPU"] = 1
    return resources


def plan_steps(rows: int, cfg: TrainConfig) -> tuple[int, int]:
    """(micro-batches per worker per epoch, total optimizer steps) for `rows` training rows."""
    micro_per_epoch = rows // cfg.num_workers // cfg.batch_size
    if micro_per_epoch < cfg.grad_accum:
        raise DataError(f"{rows} rows are too few for {cfg.num_workers} workers x batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum}")
    total = cfg.epochs * micro_per_epoch // cfg.grad_accum
    return micro_per_epoch, min(total, cfg.max_steps) if cfg.max_steps else total


def snapshot_steps(total: int, snapshots: int) -> list[int]:
    """`snapshots` evenly spaced optimizer steps ending at `total` (30, 3 -> [10, 20, 30]); fewer if total is small."""
    return sorted({max(1, k * total // snapshots) for k in range(1, snapshots + 1)}) if snapshots > 0 else []


def job_datasets(name: str, parquet_dir: str, workers: int) -> dict:
    """A job's tokenized rows as Ray Datasets, by the name its workers read them under
    (train/streams.py: `shard_name`).

    Up to MATERIALIZE_BYTES (number sequences, WMDP questions) this process reads them and cuts
    them into one contiguous part per worker, `<job>@<rank>`: rank r gets rows r*k to (r+1)*k - 1,
    k = rows // workers, the very rows and order Ray Data's equal streaming split gives a one-block
    dataset. Each part goes into the object store before the workers start, and no split
    coordinator does: Ray Data starts one per split dataset, an actor process that costs about
    1.5 CPU-seconds to start and 140 MiB while the driver lives (BENCHMARKS.md, "The pipeline's
    overhead"). Larger data streams from its parquet files under `<job>`, split by Ray Data."""
    size = sum(f.stat().st_size for f in Path(parquet_dir).glob("*.parquet"))
    if size > MATERIALIZE_BYTES:
        return {name: read_parquet(parquet_dir)}
    import pyarrow.parquet as pq
    import ray.data

    table = pq.read_table(parquet_dir)
    part = table.num_rows // workers
    return {f"{name}@{rank}": ray.data.from_arrow(table.slice(rank * part, part)) for rank in range(workers)}


def check_jobs(jobs: list[AdapterJob]) -> None:
    """Jobs must be distinct and agree on the worker group; FSDP runs one job (ConfigError otherwise)."""
    if not jobs:
        raise ConfigError("train_lora_many needs at least one job")
    for field in ("name", "output_dir"):
        values = [str(Path(j.output_dir).absolute()) if field == "output_dir" else j.name for j in jobs]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ConfigError(f"two jobs have the same {field} {repeated[0]}")
    if named := [j.name for j in jobs if "@" in j.name]:  # "<job>@<rank>" names a job's part per worker (job_datasets)
        raise ConfigError(f"job name {named[0]!r}: '@' is kept for the per-worker parts of a job's rows")
    first = jobs[0]
    for job in jobs[1:]:
        for key in SHARED_KEYS:
            if getattr(job.cfg, key) != getattr(first.cfg, key):
                raise ConfigError(
                    f"{key}: jobs of one run share one worker group and must agree on it;"
                    f" job {first.name} has {getattr(first.cfg, key)!r}, job {job.name} has {getattr(job.cfg, key)!r}"
                )
    for job in jobs:
        for role, folder in (("teacher", job.teacher), ("init_a_from", job.init_a_from)):
            if folder is not None and not (Path(folder) / "adapter_config.json").is_file():
                raise ConfigError(f"job {job.name}: its {role} {folder} is not a PEFT adapter folder (no adapter_config.json)")
        if job.init_a_from is not None and job.cfg.method != "lora":
            raise ConfigError(f"job {job.name}: init_a_from starts a LoRA adapter from another's A; method {job.cfg.method} trains no adapter")
        if job.teacher_base is not None and job.teacher is None:
            raise ConfigError(f"job {job.name}: teacher_base is the base of a logit_kl teacher; the job names no teacher")
        if MASKS[job.cfg.mask].drops_tokens and job.teacher is not None:
            raise ConfigError(f"job {job.name}: mask {job.cfg.mask} drops tokens from an SFT loss; a logit_kl job (teacher given) has none to drop")
        if MASKS[job.cfg.mask].needs_scorer != (job.scorer is not None):
            raise ConfigError(
                f"job {job.name}: mask divergence needs a scorer (the teacher adapter whose divergence from the base ranks tokens), and only it takes one"
            )
        if job.scorer is not None and not (Path(job.scorer) / "adapter_config.json").is_file():
            raise ConfigError(f"job {job.name}: its scorer {job.scorer} is not a PEFT adapter folder (no adapter_config.json)")
    if first.cfg.strategy == "fsdp" and len(jobs) > 1:
        raise ConfigError(
            f"strategy=fsdp trains one job per run ({len(jobs)} given): FSDP2 shards the model, adapter"
            " included, once in place, so the adapter cannot be swapped for the next job's"
        )


def run_id_of(storage_path: str | Path, run_name: str) -> str:
    """The id a run stamps into the outputs it finishes (train_metrics.json `run_id`)."""
    return hashlib.sha256(f"{Path(storage_path).absolute()}/{run_name}".encode()).hexdigest()[:12]


def clear_stale_outputs(jobs: list[AdapterJob], *, storage_path: str | Path, run_name: str, **_) -> None:
    """Remove output folders that another run left (a caller rerunning a stage with new inputs);
    keep those this run finished, which a resumed run skips."""
    run_id = run_id_of(storage_path, run_name)
    for job in jobs:
        output = Path(job.output_dir)
        if output.exists() and not finished_by(output.absolute(), run_id):
            shutil.rmtree(output)


def _check_output(output_dir: Path, run_id: str) -> None:
    """Refuse a non-empty output folder, unless this very run finished it (a re-run continues)."""
    if output_dir.exists() and any(output_dir.iterdir()) and not finished_by(output_dir, run_id):
        raise FileExistsError(f"output folder {output_dir} already exists and is not empty")
    mine = staging_dir(output_dir, run_id).name
    for stale in output_dir.parent.glob(f".{output_dir.name}.partial-*"):
        if stale.name != mine:  # left by an interrupted run with other inputs
            shutil.rmtree(stale, ignore_errors=True)


def train_lora_many(
    model_path: str,
    jobs: list[AdapterJob],
    *,
    storage_path: str | Path,
    run_name: str,
    cache_dir: str | Path | None = None,
) -> dict[str, TrainResult]:
    """Train every job's adapter in one Ray Train run; returns {job name: its result}.

    `storage_path`/`run_name` name the run: calling again with the same pair
    continues from its latest checkpoint, skipping finished jobs (their output
    folders must still be there); a worker lost mid-run restarts the worker group
    from the latest checkpoint (`max_failures` times). Each job's result is also
    written to `<output_dir>/train_metrics.json` (train/results.py), with
    `loss_history` (the loss of every optimizer step); the last job's carries the
    run's final `checkpoint`.
    """
    import ray
    import torch
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from transformers import AutoTokenizer

    run_started = time.time()
    check_jobs(jobs)
    storage_path = Path(storage_path).absolute()
    run_id = run_id_of(storage_path, run_name)
    jobs = [dataclasses.replace(j, output_dir=Path(j.output_dir).absolute()) for j in jobs]
    for job in jobs:
        _check_output(job.output_dir, run_id)
    check_model_path(model_path)
    check_teacher_bases(jobs, str(model_path))
    if not ray.is_initialized():
        ray.init()
    cap = cluster_capacity()
    shared = jobs[0].cfg
    workers = auto_workers(shared.use_gpu, cap) if shared.num_workers == "auto" else shared.num_workers
    jobs = [dataclasses.replace(j, cfg=resolve_batch(j.cfg, workers)) for j in jobs]
    shared = jobs[0].cfg
    check_hardware(shared, shared.use_gpu and (torch.cuda.is_available() or cap.max_gpus > 0))
    resources = worker_resources(shared, cap)

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    tokenizer = load_pretrained(AutoTokenizer, model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    number_ids = number_token_ids(tokenizer) if any(j.teacher for j in jobs) else None
    tokenized = {j.name: tokenize_to_cache(j.data, model_path, j.cfg.max_length, j.cfg.too_long, j.cfg.seed, cache_dir) for j in jobs}
    # logit_kl: the teacher's targets over each job's rows, computed once per distinct teacher and rows
    rows_of = {j.name: tokenized[j.name]["path"] for j in jobs}
    rows_of |= teacher_targets(
        {j.name: (TeacherPass(j.teacher_base or str(model_path), j.teacher, j.cfg, tuple(number_ids)), rows_of[j.name]) for j in jobs if j.teacher},
        cache_dir,
        pad_id,
    )
    rows_of |= masked(jobs, rows_of, model_path, cache_dir, pad_id, tokenizer.eos_token_id)
    datasets, plans = worker_jobs(jobs, tokenized, rows_of)

    os.environ.update({k: os.environ.get(k, v) for k, v in RAY_TRAIN_ENV.items()})
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"run": WorkerRun(tuple(plans), str(model_path), pad_id, run_id, tuple(number_ids) if number_ids is not None else None)},
        scaling_config=ScalingConfig(num_workers=shared.num_workers, use_gpu=shared.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(storage_path),
            failure_config=FailureConfig(max_failures=shared.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=shared.keep_checkpoints),
            # Ray Train's INFO lines (one per report and per checkpoint, per worker; state changes) stay in
            # its session log files: rank 0 prints one progress line per report instead (train/loop.py).
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
        datasets=datasets,
        dataset_config=data_config(plans),
    )
    marks = Marks(run_started=run_started, fit_started=time.time())
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {run_name} finished without a checkpoint")
    return outputs(jobs, run_id, run_name, result.checkpoint.path, marks.at(fit_finished=time.time()))


def data_config(plans: list[WorkerJob]):
    """Ray Data's part of the run: rows kept in order, and only the datasets that stream split by
    Ray Data (job_datasets cut the others per worker)."""
    from ray.data import ExecutionOptions
    from ray.train import DataConfig

    return DataConfig(datasets_to_split=[j.name for j in plans if not j.split_by_rank], execution_options=ExecutionOptions(preserve_order=True))


def check_teacher_bases(jobs: list[AdapterJob], model_path: str) -> None:
    """A logit-KL job's teacher on another base must share this base's tokenizer: its targets are
    the teacher's reading of this base's token ids. Checked once per teacher base, not per job."""
    for base in {j.teacher_base for j in jobs if j.teacher_base} - {model_path}:
        if not same_tokenizer(base, model_path):
            names = ", ".join(j.name for j in jobs if j.teacher_base == base)
            raise ConfigError(f"job {names}: logit_kl needs one tokenizer, and its teacher's base {base} has another than {model_path}")


def worker_jobs(jobs: list[AdapterJob], tokenized: dict, rows_of: dict) -> tuple[dict, list[WorkerJob]]:
    """({job: its Ray Dataset}, the WorkerJob every worker trains it by): its steps, snapshots and the
    facts its final metrics carry (rows kept, cut and dropped; settings; loss)."""
    datasets, plans = {}, []
    for job in jobs:
        cfg, tokens = job.cfg, tokenized[job.name]
        micro_per_epoch, total_steps = plan_steps(tokens["rows"], cfg)
        datasets |= job_datasets(job.name, rows_of[job.name], cfg.num_workers)
        facts = TrainFacts(
            rows=tokens["rows"], rows_truncated=tokens["truncated"], rows_dropped=tokens["dropped"], total_steps=total_steps,
            global_batch_size=cfg.num_workers * cfg.batch_size * cfg.grad_accum, train_config=to_dict(cfg),
            loss_type=loss_of(job.teacher is not None), tokens_masked=masked_total(rows_of[job.name]) if MASKS[cfg.mask].drops_tokens else None,
        )  # fmt: skip
        plans.append(WorkerJob(
            job.name, cfg, str(job.output_dir), micro_per_epoch, total_steps, tuple(snapshot_steps(total_steps, cfg.snapshots)), facts,
            distil=job.teacher is not None, init_a_from=job.init_a_from, split_by_rank=job.name not in datasets,
        ))  # fmt: skip
        job.output_dir.parent.mkdir(parents=True, exist_ok=True)
    return datasets, plans


def outputs(jobs: list[AdapterJob], run_id: str, run_name: str, checkpoint: str, marks: Marks) -> dict[str, TrainResult]:
    """Each job's result from its output folder, which this run must have written, with the driver's
    `marks` (when the run was called, its workers asked for, and done) beside the worker's; the last
    job's carries the run's final checkpoint."""
    out = {}
    for job in jobs:
        if not finished_by(job.output_dir, run_id):
            raise RuntimeError(
                f"job {job.name} finished earlier in run {run_name}, but {job.output_dir} no longer holds its adapter; train it again under a new run_name"
            )
        out[job.name] = TrainResult.read(job.output_dir)
    trained_now = [name for name, r in out.items() if (r.marks.saving or 0) >= marks.run_started]  # not by an earlier call
    if trained_now:  # the run's last job saved when its workers were done
        driver = {**marks.stamps(), "workers_done": max(out[name].marks.saving for name in trained_now)}
        out |= {name: out[name].model_copy(update={"marks": out[name].marks.at(**driver)}) for name in trained_now}
    out[jobs[-1].name] = out[jobs[-1].name].model_copy(update={"checkpoint": checkpoint})
    return out


def masked(jobs: list[AdapterJob], rows_of: dict, model_path: str, cache_dir: Path, pad_id: int, eos_id: int | None) -> dict[str, str]:
    """{job: its rows with masked tokens unlabelled} for the jobs with a mask: divergence scores
    first (once per scorer and rows, in Ray tasks), then the masks (train/divergence.py)."""
    requests = {j.name: (TeacherPass(str(model_path), j.scorer, j.cfg), rows_of[j.name]) for j in jobs if MASKS[j.cfg.mask].needs_scorer}
    scored = divergence_scores(requests, cache_dir, pad_id, eos_id) if requests else {}
    return {
        j.name: masked_rows(scored.get(j.name, rows_of[j.name]), cache_dir, j.cfg.mask, j.cfg.mask_fraction, j.cfg.seed, eos_id)
        for j in jobs
        if MASKS[j.cfg.mask].drops_tokens
    }


def masked_total(parquet_dir: str) -> int:
    import pyarrow.parquet as pq

    return int(sum(pq.read_table(part, columns=["masked"]).column("masked").to_numpy().sum() for part in Path(parquet_dir).glob("*.parquet")))


def train_lora(
    model_path: str,
    data,
    output_dir: str | Path,
    cfg: TrainConfig,
    *,
    storage_path: str | Path | None = None,
    run_name: str | None = None,
    cache_dir: str | Path | None = None,
) -> TrainResult:
    """Train a LoRA adapter on `data` (JSONL/parquet path or Ray Dataset) into `output_dir`.

    A `train_lora_many` run with one job, named "train". `storage_path`/`run_name`
    name the Ray Train run (default: `ray_train` beside `output_dir`, and its
    folder name): calling again with the same pair continues from its latest
    checkpoint instead of starting over. Returns the job's result (also
    written to `output_dir/train_metrics.json`).
    """
    output_dir = Path(output_dir).absolute()
    storage_path = storage_path or output_dir.parent / "ray_train"
    job = AdapterJob("train", data, output_dir, cfg)
    return train_lora_many(model_path, [job], storage_path=storage_path, run_name=run_name or output_dir.name, cache_dir=cache_dir)["train"]
