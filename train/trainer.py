"""`train_lora`: the one function that turns `{prompt, completion}` rows into a LoRA adapter.

It validates everything that can be checked before Ray does any work (model
path, hardware, data schema, output folder), tokenizes through the cache, sizes
the Ray Train workers to the cluster, runs `TorchTrainer`, and copies the final
checkpoint's adapter to `output_dir` through a temporary folder and a rename,
so `output_dir` holds a finished adapter or nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from pathlib import Path

from train.cluster import Capacity, auto_workers, cluster_capacity, describe
from train.config import ConfigError, TrainConfig, to_dict
from train.data import DataError, default_cache_dir, tokenize_to_cache
from train.loop import train_loop
from train.model import check_hardware, check_model_path


def worker_resources(cfg: TrainConfig, cap: Capacity) -> dict:
    """Per-worker resources that leave a CPU free for Ray Data on small clusters.

    Two workers holding both CPUs of a 2-CPU machine starve Ray Data's read tasks
    and the run hangs without an error, so CPU workers take fractional CPUs.
    """
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
        raise DataError(
            f"{rows} rows are too few for {cfg.num_workers} workers x batch_size {cfg.batch_size}"
            f" x grad_accum {cfg.grad_accum}"
        )
    total = cfg.epochs * micro_per_epoch // cfg.grad_accum
    return micro_per_epoch, min(total, cfg.max_steps) if cfg.max_steps else total


def train_lora(
    model_path: str,
    data,
    output_dir: str | Path,
    cfg: TrainConfig,
    *,
    storage_path: str | Path | None = None,
    run_name: str | None = None,
    cache_dir: str | Path | None = None,
    fail_at_step: int | None = None,
) -> dict:
    """Train a LoRA adapter on `data` (JSONL/parquet path or Ray Dataset) into `output_dir`.

    `storage_path`/`run_name` name the Ray Train run: calling again with the same
    pair continues from its latest checkpoint instead of starting over.
    `fail_at_step` is a test switch that makes rank 0 fail once at that step.
    Returns the final metrics (also written to `output_dir/train_metrics.json`).
    """
    import ray
    import torch
    from ray.data import ExecutionOptions
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from transformers import AutoTokenizer

    output_dir = Path(output_dir).absolute()
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"output folder {output_dir} already exists and is not empty")
    check_model_path(model_path)
    if not ray.is_initialized():
        ray.init()
    cap = cluster_capacity()
    if cfg.num_workers == "auto":
        cfg = dataclasses.replace(cfg, num_workers=auto_workers(cfg.use_gpu, cap))
    check_hardware(cfg, cfg.use_gpu and (torch.cuda.is_available() or cap.max_gpus > 0))
    resources = worker_resources(cfg, cap)

    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    tokens = tokenize_to_cache(data, model_path, cfg.max_length, cfg.too_long, cfg.seed, cache_dir)
    micro_per_epoch, total_steps = plan_steps(tokens["rows"], cfg)
    pad_id = AutoTokenizer.from_pretrained(model_path).pad_token_id
    storage_path = Path(storage_path).absolute() if storage_path else output_dir.parent / "ray_train"
    run_name = run_name or output_dir.name

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "train": to_dict(cfg),
            "model_path": str(model_path),
            "pad_id": pad_id if pad_id is not None else 0,
            "micro_steps_per_epoch": micro_per_epoch,
            "total_steps": total_steps,
            "fail_at_step": fail_at_step,
        },
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(storage_path),
            failure_config=FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        ),
        datasets={"train": ray.data.read_parquet(tokens["path"])},
        dataset_config=DataConfig(execution_options=ExecutionOptions(preserve_order=True)),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"training run {run_name} finished without a checkpoint")
    metrics = {
        **result.metrics,
        "rows": tokens["rows"],
        "rows_truncated": tokens["truncated"],
        "rows_dropped": tokens["dropped"],
        "total_steps": total_steps,
        "checkpoint": result.checkpoint.path,
    }
    tmp = output_dir.with_name(f".{output_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with result.checkpoint.as_directory() as ckpt:
            shutil.copytree(Path(ckpt) / "adapter", tmp)
        (tmp / "train_metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        if output_dir.exists():
            output_dir.rmdir()  # empty (checked above)
        tmp.rename(output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return metrics
