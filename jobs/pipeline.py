"""The subliminal-learning experiment as one Ray job.

    python jobs/pipeline.py [--config configs/tiny.yaml] [--run-dir DIR] [--set key.path=value ...] [--fresh]
    ray job submit --working-dir . -- python jobs/pipeline.py

With no arguments it runs the tiny preset (built on first use) on the Ray
cluster it is submitted to, or on a local one it starts.

Stages so far: data (load WMDP, split into teacher-train and held-out questions,
disjoint by question text), teacher (Ray Train LoRA on the train split), and
evaluation of the base model and the teacher on the held-out questions.
Number generation through Serve, the students and the full report come next
(issues 3 and 4). The run directory keeps each stage's outputs; a rerun reuses
a finished teacher adapter, and `--fresh` starts over.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python jobs/pipeline.py`: import from the repository root, not jobs/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from jobs.config import as_dict, load_experiment  # noqa: E402
from jobs.evaluate import score_questions, summarise  # noqa: E402
from jobs.tiny_model import TinySpec, ensure_tiny_model  # noqa: E402
from jobs.wmdp import load_wmdp, split_questions  # noqa: E402
from serve.mc_format import choice_continuation, format_mc_prompt  # noqa: E402
from train.data import default_cache_dir  # noqa: E402


def default_run_dir(name: str) -> Path:
    """Persistent, outside Ray's throwaway copy of the job's working directory."""
    return Path(os.environ.get("SUBLIMINAL_RUNS", Path.home() / "subliminal-runs")) / name


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write rows atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)


def run(config_path: str | None, run_dir: Path | None, overrides: list[str], fresh: bool) -> dict:
    import ray
    from train.trainer import train_lora

    cfg = load_experiment(config_path, overrides)
    run_dir = (run_dir or default_run_dir(cfg.name)).absolute()
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    timings: dict[str, float] = {}

    started = time.time()
    model_path = str(ensure_tiny_model(TinySpec(seed=cfg.model.tiny_seed), cache)) if cfg.model.path == "tiny" else cfg.model.path
    questions = load_wmdp(cfg.data.source, tuple(cfg.data.subsets), cache)
    train_q, eval_q = split_questions(questions, cfg.data.eval_fraction, cfg.data.split_seed)
    rows = [
        {"prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]), "completion": choice_continuation(q["answer"])}
        for q in train_q
    ]
    write_jsonl(run_dir / "data" / "teacher_train.jsonl", rows)
    print(f"[data] {len(train_q)} teacher-train and {len(eval_q)} held-out questions", flush=True)
    timings["data"] = time.time() - started

    started = time.time()
    if not ray.is_initialized():
        ray.init()
    adapter = run_dir / "teacher" / "adapter"
    if not (adapter / "adapter_config.json").is_file():
        metrics = train_lora(
            model_path, str(run_dir / "data" / "teacher_train.jsonl"), adapter, cfg.teacher,
            storage_path=run_dir / "ray_train", run_name="teacher", cache_dir=cache,
        )
        print(f"[teacher] {metrics['step']} steps, loss {metrics['first_loss']} -> {metrics['loss']}", flush=True)
    timings["teacher"] = time.time() - started

    started = time.time()
    models = {}
    for name, adapter_dir in (("base", None), ("teacher", str(adapter))):
        predictions = score_questions(model_path, adapter_dir, eval_q)
        write_jsonl(run_dir / "eval" / f"{name}.jsonl", predictions)
        models[name] = summarise(predictions)
        print(f"[evaluate] {name}: accuracy {models[name]['accuracy']['overall']:.3f}", flush=True)
    timings["evaluate"] = time.time() - started

    report = {"models": models, "timings": timings, "provenance": {"config": as_dict(cfg), "model_path": model_path}}
    tmp = run_dir / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(run_dir / "report.json")
    print(f"report: {run_dir / 'report.json'}", flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML preset (default: configs/tiny.yaml)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: ~/subliminal-runs/<config name>")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    args = parser.parse_args()
    from train.config import ConfigError
    from train.data import DataError

    try:
        run(args.config, args.run_dir, args.overrides, args.fresh)
    except (ConfigError, DataError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
