"""Training six student-like adapters: one after another, side by side, or in one many-adapter run.

    python bench/arms_training.py [--adapters 6] [--rows 1000] [--workers 1 2] [--modes a b c d] [--out /tmp/arms_training.md]

Each adapter is a student of the tiny preset: its own 1,000 number-sequence
rows (bench_common.number_rows, a different seed per adapter), LoRA r=8 on all
linear layers, 32 rows per optimizer step (global_batch_size, so the same 31
steps on 1 or 2 workers), 1 epoch, lr 2e-3. For each worker count:

  (a) sequential: one `train_lora` run per adapter, one after another;
  (b) concurrent: every `train_lora` run at once, each inside a
      `ray.remote(num_cpus=0)` task, with cpus_per_worker sized so the workers
      of all runs together leave one CPU free for Ray Data;
  (c) many: one `train_lora_many` run with the six adapters as jobs;
  (d) as (c), each job's rows streamed from their parquet files instead of read
      into the object store before the workers start (train.ray_run.job_datasets).

The rows are tokenized into the cache before timing, so every mode measures
training: worker start, base model load, steps, checkpoints and adapter
writes. Prints a table of wall seconds and the ratio to (a), and writes it to
--out. The machine's load (`os.getloadavg`) before and after is printed too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import number_rows, tiny_model, write_rows


def config(workers: int, cpus_per_worker: float | None = None):
    from train.config import TrainConfig

    return TrainConfig(
        num_workers=workers,
        batch_size=32 // workers,
        global_batch_size=32,
        epochs=1,
        lr=2e-3,
        max_length=128,
        log_every=10,
        checkpoint_every=40,
        cpus_per_worker=cpus_per_worker,
    )


def sequential(model: str, files: list[Path], workers: int, out: Path, cache: Path) -> float:
    from train.trainer import train_lora

    started = time.time()
    for i, path in enumerate(files):
        train_lora(
            model,
            path,
            out / f"a{i}",
            config(workers),
            storage_path=out / "ray_train",
            run_name=f"a{i}",
            cache_dir=cache,
        )
    return time.time() - started


def concurrent(model: str, files: list[Path], workers: int, out: Path, cache: Path) -> float:
    import ray

    from train.trainer import train_lora

    cpus = ray.cluster_resources()["CPU"]
    each = (cpus - 1) / (workers * len(files))  # all workers of all runs leave one CPU to Ray Data
    run = ray.remote(num_cpus=0)(train_lora)
    started = time.time()
    refs = [
        run.remote(
            model,
            str(path),
            out / f"b{i}",
            config(workers, each),
            storage_path=out / "ray_train",
            run_name=f"b{i}",
            cache_dir=cache,
        )
        for i, path in enumerate(files)
    ]
    ray.get(refs)
    return time.time() - started


def many(model: str, files: list[Path], workers: int, out: Path, cache: Path) -> float:
    from train.adapter_job import AdapterJob
    from train.trainer import train_lora_many

    jobs = [AdapterJob(f"c{i}", path, out / f"c{i}", config(workers)) for i, path in enumerate(files)]
    started = time.time()
    train_lora_many(model, jobs, storage_path=out / "ray_train", run_name="c", cache_dir=cache)
    return time.time() - started


def many_streamed(model: str, files: list[Path], workers: int, out: Path, cache: Path) -> float:
    import train.ray_run

    saved, train.ray_run.MATERIALIZE_BYTES = train.ray_run.MATERIALIZE_BYTES, -1  # every dataset streams
    try:
        return many(model, files, workers, out, cache)
    finally:
        train.ray_run.MATERIALIZE_BYTES = saved


MODES = {
    "a": ("(a) one after another", sequential),
    "b": ("(b) side by side", concurrent),
    "c": ("(c) one many-run", many),
    "d": ("(d) one many-run, streamed from parquet", many_streamed),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=6)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--modes", nargs="+", choices=sorted(MODES), default=sorted(MODES), help="ratios are to the first"
    )
    parser.add_argument("--out", default="/tmp/arms_training.md")
    args = parser.parse_args()

    import ray

    from train.data import tokenize_to_cache

    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    model = tiny_model()
    tmp = Path(tempfile.mkdtemp(prefix="arms-training-"))
    cache = tmp / "cache"
    load_before = os.getloadavg()  # the machine may be shared: say how busy it was
    ray.init(include_dashboard=False, log_to_driver=False)
    files = [write_rows(number_rows(args.rows, seed=i), tmp / "data" / f"rows{i}.jsonl") for i in range(args.adapters)]
    for path in files:  # warm the tokenized cache: the modes below time training only
        tokenize_to_cache(path, model, config(1).max_length, config(1).too_long, config(1).seed, cache)

    rows = []
    try:
        for workers in args.workers:
            base = None
            for label, fn in (MODES[m] for m in args.modes):
                out = tmp / f"w{workers}-{fn.__name__}"
                seconds = fn(model, files, workers, out, cache)
                base = base or seconds
                rows.append((workers, label, seconds, seconds / base))
                print(f"workers={workers} {label}: {seconds:.1f} s ({seconds / base:.2f} x the first)", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        load_after = os.getloadavg()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)

    cpus = os.cpu_count()
    lines = [
        f"{args.adapters} adapters x {args.rows} rows, tiny model, global batch 32, 1 epoch; {cpus} CPUs;"
        f" 1-minute load average {load_before[0]:.1f} before, {load_after[0]:.1f} after",
        "",
        "| workers per run | mode | wall s | vs the first |",
        "|---|---|---|---|",
        *(f"| {w} | {label} | {s:.1f} | {r:.2f} |" for w, label, s, r in rows),
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    Path(args.out).write_text(table)


if __name__ == "__main__":
    main()
