"""`train_lora` and `train_lora_many`: `{prompt, completion}` rows in, LoRA adapters out (or, under
`method: full`, fully fine-tuned model folders).

`train_lora_many` trains several adapters in ONE Ray Train run over one copy of
the base model per worker (train/loop.py): the base loads once, and every job
after the first saves the load, the worker start and the process group. It
validates everything that can be checked before Ray does any work (jobs agree
on what the worker group shares: train/adapter_job.py; model path, hardware,
global batch, data schema, output folders), sizes the workers to the cluster
(train/ray_run.py), tokenizes each job's rows through the cache, has the
teacher of each logit_kl job score its rows once (train/distill.py: one set of
targets per teacher and rows, shared by the jobs that read them), and runs
`TorchTrainer` with one dataset per job (train/ray_run.py). Rank
0 writes each finished adapter straight into its `output_dir` through a staging
folder and a rename (train/outputs.py), so an output folder holds a finished
adapter or nothing. `train_lora` is the same run with one job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import time
from pathlib import Path

from common.config import to_dict
from common.files import DataError, default_cache_dir
from common.model_source import load_pretrained
from train.adapter_job import AdapterJob, check_jobs, check_teacher_bases
from train.axes import MASKS, loss_of
from train.config import TrainConfig
from train.data import tokenize_to_cache
from train.distill import number_token_ids, teacher_targets
from train.divergence import divergence_scores, masked_rows
from train.model import check_model_path
from train.outputs import finished_by, staging_dir
from train.ray_run import job_datasets, place, ray_trainer
from train.results import Marks, TrainFacts, TrainResult
from train.teacher_pass import TeacherPass
from train.worker_job import WorkerJob, WorkerRun


def plan_steps(rows: int, cfg: TrainConfig) -> tuple[int, int]:
    """(micro-batches per worker per epoch, total optimizer steps) for `rows` training rows."""
    micro_per_epoch = rows // cfg.num_workers // cfg.batch_size
    if micro_per_epoch < cfg.grad_accum:
        raise DataError(
            f"{rows} rows are too few for {cfg.num_workers} workers x batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum}"
        )
    total = cfg.epochs * micro_per_epoch // cfg.grad_accum
    return micro_per_epoch, min(total, cfg.max_steps) if cfg.max_steps else total


def snapshot_steps(total: int, snapshots: int) -> list[int]:
    """`snapshots` evenly spaced optimizer steps ending at `total` (30, 3 -> [10, 20, 30]); fewer if total is small."""
    return sorted({max(1, k * total // snapshots) for k in range(1, snapshots + 1)}) if snapshots > 0 else []


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
    run_started = time.time()
    check_jobs(jobs)
    storage_path = Path(storage_path).absolute()
    run_id = run_id_of(storage_path, run_name)
    jobs = [dataclasses.replace(j, output_dir=Path(j.output_dir).absolute()) for j in jobs]
    for job in jobs:
        _check_output(job.output_dir, run_id)
    check_model_path(model_path)
    check_teacher_bases(jobs, str(model_path))
    jobs, resources = place(jobs)
    run, datasets = prepare(model_path, jobs, run_id, cache_dir)
    trainer = ray_trainer(run, datasets, run_name=run_name, storage_path=storage_path, resources=resources)
    marks = Marks(run_started=run_started, fit_started=time.time())
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {run_name} finished without a checkpoint")
    return outputs(jobs, run_id, run_name, result.checkpoint.path, marks.at(fit_finished=time.time()))


def prepare(
    model_path: str, jobs: list[AdapterJob], run_id: str, cache_dir: str | Path | None
) -> tuple[WorkerRun, dict]:
    """What every worker is handed (the WorkerRun) and the Ray Datasets it reads: each job's rows
    tokenized through the cache, a logit_kl job's rows with its teacher's targets, a masked job's
    with its masked tokens unlabelled, and its steps planned (worker_jobs)."""
    from transformers import AutoTokenizer

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    tokenizer = load_pretrained(AutoTokenizer, model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    number_ids = number_token_ids(tokenizer) if any(j.teacher for j in jobs) else None
    tokenized = {
        j.name: tokenize_to_cache(j.data, model_path, j.cfg.max_length, j.cfg.too_long, j.cfg.seed, cache_dir)
        for j in jobs
    }
    # logit_kl: the teacher's targets over each job's rows, computed once per distinct teacher and rows
    rows_of = {j.name: tokenized[j.name]["path"] for j in jobs}
    rows_of |= teacher_targets(
        {
            j.name: (
                TeacherPass(j.teacher_base or str(model_path), j.teacher, j.cfg, tuple(number_ids)),
                rows_of[j.name],
            )
            for j in jobs
            if j.teacher
        },
        cache_dir,
        pad_id,
    )
    rows_of |= masked(jobs, rows_of, model_path, cache_dir, pad_id, tokenizer.eos_token_id)
    datasets, plans = worker_jobs(jobs, tokenized, rows_of)
    return WorkerRun(
        tuple(plans), str(model_path), pad_id, run_id, tuple(number_ids) if number_ids is not None else None
    ), datasets


def worker_jobs(jobs: list[AdapterJob], tokenized: dict, rows_of: dict) -> tuple[dict, list[WorkerJob]]:
    """({job: its Ray Dataset}, the WorkerJob every worker trains it by): its steps, snapshots and the
    facts its final metrics carry (rows kept, cut and dropped; settings; loss)."""
    datasets, plans = {}, []
    for job in jobs:
        cfg, tokens = job.cfg, tokenized[job.name]
        micro_per_epoch, total_steps = plan_steps(tokens["rows"], cfg)
        datasets |= job_datasets(job.name, rows_of[job.name], cfg.num_workers)
        facts = TrainFacts(
            rows=tokens["rows"],
            rows_truncated=tokens["truncated"],
            rows_dropped=tokens["dropped"],
            total_steps=total_steps,
            global_batch_size=cfg.num_workers * cfg.batch_size * cfg.grad_accum,
            train_config=to_dict(cfg),
            loss_type=loss_of(job.teacher is not None),
            tokens_masked=masked_total(rows_of[job.name]) if MASKS[cfg.mask].drops_tokens else None,
        )
        plans.append(
            WorkerJob(
                job.name,
                cfg,
                str(job.output_dir),
                micro_per_epoch,
                total_steps,
                tuple(snapshot_steps(total_steps, cfg.snapshots)),
                facts,
                distil=job.teacher is not None,
                init_a_from=job.init_a_from,
                split_by_rank=job.name not in datasets,
            )
        )
        job.output_dir.parent.mkdir(parents=True, exist_ok=True)
    return datasets, plans


def outputs(
    jobs: list[AdapterJob], run_id: str, run_name: str, checkpoint: str, marks: Marks
) -> dict[str, TrainResult]:
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
    # not by an earlier call
    trained_now = [name for name, r in out.items() if (r.marks.saving or 0) >= marks.run_started]
    if trained_now:  # the run's last job saved when its workers were done
        driver = {**marks.stamps(), "workers_done": max(out[name].marks.saving for name in trained_now)}
        out |= {name: out[name].model_copy(update={"marks": out[name].marks.at(**driver)}) for name in trained_now}
    out[jobs[-1].name] = out[jobs[-1].name].model_copy(update={"checkpoint": checkpoint})
    return out


def masked(
    jobs: list[AdapterJob], rows_of: dict, model_path: str, cache_dir: Path, pad_id: int, eos_id: int | None
) -> dict[str, str]:
    """{job: its rows with masked tokens unlabelled} for the jobs with a mask: divergence scores
    first (once per scorer and rows, in Ray tasks), then the masks (train/divergence.py)."""
    requests = {
        j.name: (TeacherPass(str(model_path), j.scorer, j.cfg), rows_of[j.name])
        for j in jobs
        if MASKS[j.cfg.mask].needs_scorer
    }
    scored = divergence_scores(requests, cache_dir, pad_id, eos_id) if requests else {}
    return {
        j.name: masked_rows(
            scored.get(j.name, rows_of[j.name]), cache_dir, j.cfg.mask, j.cfg.mask_fraction, j.cfg.seed, eos_id
        )
        for j in jobs
        if MASKS[j.cfg.mask].drops_tokens
    }


def masked_total(parquet_dir: str) -> int:
    import pyarrow.parquet as pq

    return int(
        sum(
            pq.read_table(part, columns=["masked"]).column("masked").to_numpy().sum()
            for part in Path(parquet_dir).glob("*.parquet")
        )
    )


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
    return train_lora_many(
        model_path, [job], storage_path=storage_path, run_name=run_name or output_dir.name, cache_dir=cache_dir
    )["train"]
