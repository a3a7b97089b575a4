"""A `train_lora_many` run's Ray Train side: the worker group sized to the cluster and placed on it
(`place`, `worker_resources`), each job's rows handed to the workers (`job_datasets`, `data_config`),
and the `TorchTrainer` that runs train/loop.py over them (`ray_trainer`).

Apart from the driver's checks, data and results (train/trainer.py): this is the part that asks Ray
for resources, and what a change of cluster, worker count or data size touches.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from common.config import ConfigError
from train.adapter_job import AdapterJob
from train.cluster import Capacity, auto_workers, cluster_capacity, describe
from train.config import TrainConfig, resolve_batch
from train.data import read_parquet
from train.loop import train_loop
from train.model import check_hardware
from train.worker_job import WorkerJob, WorkerRun

RAY_TRAIN_ENV = {  # read by the process building a trainer, which passes them on to its controller
    "RAY_TRAIN_ENABLE_STATE_TRACKING": "1",  # the dashboard's Train view lists the run
    # The controller polls its workers this often (Ray's default 2 s): a run's end was seen 1-2 s
    # late, once per run (BENCHMARKS.md, "The pipeline's overhead").
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    # Ray 2.60 starts a watcher of draining nodes per run that only logs, and tells a loop that asks
    # (ray.train.get_preemption_info; this one does not): off, a process less a run, and its start's
    # ERROR line ("constructor arguments in the object store and max_restarts > 0") out of the job log.
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}
MATERIALIZE_BYTES = 256 * 2**20  # tokenized data up to this size is read before the workers start (job_datasets)


def place(jobs: list[AdapterJob]) -> tuple[list[AdapterJob], dict]:
    """The jobs with their batch resolved for the run's worker count (`num_workers: auto`: sized to
    the cluster, train/cluster.py), checked against the hardware there, and each worker's resources."""
    import ray
    import torch

    if not ray.is_initialized():
        ray.init()
    cap = cluster_capacity()
    shared = jobs[0].cfg
    workers = auto_workers(shared.use_gpu, cap) if shared.num_workers == "auto" else shared.num_workers
    jobs = [dataclasses.replace(j, cfg=resolve_batch(j.cfg, workers)) for j in jobs]
    shared = jobs[0].cfg
    check_hardware(shared, shared.use_gpu and (torch.cuda.is_available() or cap.max_gpus > 0))
    return jobs, worker_resources(shared, cap)


def worker_resources(cfg: TrainConfig, cap: Capacity) -> dict:
    """Per-worker resources that leave a CPU free for Ray Data on small clusters.

    Two workers holding both CPUs of a 2-CPU machine starve Ray Data's read tasks
    and the run hangs without an error, so CPU workers take fractional CPUs
    (cfg.cpus_per_worker when several runs share the cluster at once). Sized to the
    CPUs the cluster can have (Capacity.cpus_at_most): on an autoscaling cluster the
    CPUs there now may be the head's alone, and a request sized to them would ask
    the autoscaler for nothing, packing every worker onto the nodes already up.
    """
    if cfg.cpus_per_worker is not None:
        resources = {"CPU": cfg.cpus_per_worker}
    else:
        resources = {"CPU": min(1.0, max(0.1, (max(cap.cpus_at_most, 1) - 1) / cfg.num_workers))}
    if cfg.use_gpu:
        if cap.max_gpus < cfg.num_workers:
            raise ConfigError(
                f"num_workers={cfg.num_workers} GPU workers need {cfg.num_workers} GPUs; the cluster has {describe(cap)}"
            )
        resources["GPU"] = 1
    return resources


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


def ray_trainer(run: WorkerRun, datasets: dict, *, run_name: str, storage_path: Path, resources: dict):
    """The TorchTrainer of the run `run_name` under `storage_path`: `train_loop` on every worker,
    handed `run`, reading `datasets`."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    shared = run.jobs[0].cfg
    os.environ.update({k: os.environ.get(k, v) for k, v in RAY_TRAIN_ENV.items()})
    return TorchTrainer(
        train_loop,
        train_loop_config={"run": run},
        scaling_config=ScalingConfig(
            num_workers=shared.num_workers, use_gpu=shared.use_gpu, resources_per_worker=resources
        ),
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
        dataset_config=data_config(list(run.jobs)),
    )


def data_config(plans: list[WorkerJob]):
    """Ray Data's part of the run: rows kept in order, and only the datasets that stream split by
    Ray Data (job_datasets cut the others per worker)."""
    from ray.data import ExecutionOptions
    from ray.train import DataConfig

    return DataConfig(
        datasets_to_split=[j.name for j in plans if not j.split_by_rank],
        execution_options=ExecutionOptions(preserve_order=True),
    )
