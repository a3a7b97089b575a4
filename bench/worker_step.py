"""A training step inside a Ray Train worker: a bare loop against the trainer's own, on the same batches.

    python bench/worker_step.py --workers 2     # the pipeline's arms: 2 workers x 32 rows, half a CPU each
    python bench/worker_step.py --workers 1 --cpus 1

Each worker reads 30 packed micro-batches of number-sequence rows (32 rows each,
max_length 128, the default preset's students) from its Ray Data shard before
timing, then trains a fresh LoRA adapter over the same base on them in turn:

  bare     forward_loss, backward, clip, AdamW step: compute_floor.py's step;
  ddp      the same under DistributedDataParallel (the trainer's wrapper);
  trainer  train/loop.py's own micro_step (its JobState, window, schedule: train/worker_job.py);
  streamed the trainer's micro_step fed live by the shard's iterator (Ray Data running beside it).

Each in that order twice; prints rank 0's median seconds per step of each. The
difference between bare and the rest is what the trainer and DDP add; bare
against `bench/compute_floor.py`'s plain process is what running as one of two
Ray workers on the CPUs costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_common import number_rows, tiny_model, write_rows

ORDER = ("bare", "ddp", "trainer", "streamed") * 2


def worker(config: dict) -> None:
    import ray.train
    import torch

    from train.collate import PackBatch
    from train.loop import micro_step
    from train.model import attach_lora, load_base, unwrap, wrap_distributed
    from train.step import apply_step, forward_loss
    from train.worker_job import start_job

    run = config["run"]
    job, cfg = run.jobs[0], run.jobs[0].cfg
    shard = ray.train.get_dataset_shard(job.name)

    def stream():
        return shard.iter_torch_batches(
            batch_size=cfg.batch_size, collate_fn=PackBatch(cfg.max_length, run.pad_id, False), drop_last=True
        )

    batches = list(stream())[: config["steps"]]
    base = load_base(run.model_path, cfg, torch.device("cpu"))

    def plain(wrap: bool) -> list[float]:
        model = attach_lora(base, cfg)
        model = wrap_distributed(model, cfg, torch.device("cpu"), ddp_alone=True) if wrap else model
        params = [p for p in model.parameters() if p.requires_grad]
        opt, times = torch.optim.AdamW(params, lr=cfg.lr), []
        model.train()
        for batch in batches:
            started = time.perf_counter()
            forward_loss(model, batch).backward()
            apply_step(params, opt, cfg.max_grad_norm)
            times.append(time.perf_counter() - started)
        unwrap(model).unload()
        return times

    def trainer(live: bool) -> list[float]:
        t = start_job(attach_lora(base, cfg), job, run, None)
        t.model.train()
        source, times = iter(stream()) if live else iter(batches), []
        for _ in batches:
            batch = next(source)
            started = time.perf_counter()
            micro_step(t, batch, cfg)
            times.append(time.perf_counter() - started)
        unwrap(t.model).unload()
        return times

    ways = {
        "bare": lambda: plain(False),
        "ddp": lambda: plain(True),
        "trainer": lambda: trainer(False),
        "streamed": lambda: trainer(True),
    }
    results: dict[str, list[float]] = {}
    for way in ORDER:
        results.setdefault(way, []).append(statistics.median(ways[way]()))
    if ray.train.get_context().get_world_rank() == 0:
        print("WORKER_STEP " + json.dumps({"threads": torch.get_num_threads(), **results}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus", type=float, default=None, help="CPUs per worker (default: the trainer's sizing)")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import ray
    import ray.data
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    from train.cluster import cluster_capacity
    from train.config import TrainConfig
    from train.data import tokenize_to_cache
    from train.ray_run import worker_resources
    from train.worker_job import WorkerJob, WorkerRun

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    ray.init(include_dashboard=False)
    model, tmp = tiny_model(), Path(tempfile.mkdtemp(prefix="worker-step-"))
    rows = write_rows(number_rows(64 * args.steps * args.workers), tmp / "rows.jsonl")
    cfg = TrainConfig(
        num_workers=args.workers, batch_size=32, epochs=1, lr=2e-3, max_length=128, cpus_per_worker=args.cpus
    )
    tokens = tokenize_to_cache(str(rows), model, cfg.max_length, cfg.too_long, cfg.seed, tmp / "cache")
    job = WorkerJob("rows", cfg, str(tmp / "out"), 10_000, 10_000, (), {}, split_by_rank=False)
    datasets = {"rows": ray.data.from_arrow(pq.read_table(tokens["path"]))}  # split by Ray Data: each worker its half
    TorchTrainer(
        worker,
        train_loop_config={"run": WorkerRun((job,), model, 0, "worker-step"), "steps": args.steps},
        scaling_config=ScalingConfig(
            num_workers=args.workers, resources_per_worker=worker_resources(cfg, cluster_capacity())
        ),
        datasets=datasets,
    ).fit()


if __name__ == "__main__":
    main()
