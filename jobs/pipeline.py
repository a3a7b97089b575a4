"""The subliminal-learning experiment as one Ray job, from teacher to report.

    python jobs/pipeline.py [--config configs/tiny.yaml] [--run-dir DIR] [--set key.path=value ...] [--fresh]
    ray job submit --working-dir . -- python jobs/pipeline.py

With no arguments it runs the tiny preset (model and data built on first use)
on the Ray cluster it is submitted to, or on a local one it starts. Stages:

1. data      WMDP questions split into teacher-train and held-out, disjoint by text
2. teacher   Ray Train LoRA on the train split (prompt = the WMDP question, completion = its letter)
3. numbers   the teacher and the base model continue number sequences through the Serve
             deployment; completions are filtered (jobs/number_sequences.py)
4. student, control   Ray Train LoRA from the teacher's LoRA init on each kept set
5. evaluate  base/teacher/student/control scored on the held-out questions in parallel
6. report    report.json, report.md, accuracy.png in the run directory

Before any stage, jobs/placement.py sizes training workers and Serve replicas
for the cluster and refuses a preset that could never fit it. Each stage
records its inputs' hash in `manifest.json`; rerunning the same
command skips finished stages and resumes an interrupted one (training from its
last checkpoint). The Serve application is named after the run and torn down
when a stage ends, fails, or the job is stopped (`ray job stop`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python jobs/pipeline.py`: import from the repository root, not jobs/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from jobs.config import ExperimentConfig, as_dict, load_experiment  # noqa: E402
from jobs.evaluate import score_models, summarise, transfer  # noqa: E402
from jobs.generate_numbers import NoNumbersError, generate_numbers, number_prompts  # noqa: E402
from jobs.manifest import Manifest, RunDirError, digest, file_digest  # noqa: E402
from jobs.placement import plan, resolved  # noqa: E402
from jobs.report import provenance, write_report  # noqa: E402
from jobs.tiny_model import TinySpec, ensure_tiny_model  # noqa: E402
from jobs.wmdp import load_wmdp, split_questions  # noqa: E402
from serve.mc_format import choice_continuation, format_mc_prompt  # noqa: E402
from train.cluster import cluster_capacity  # noqa: E402
from train.data import default_cache_dir  # noqa: E402
from train.model import check_model_path  # noqa: E402


def default_run_dir(name: str) -> Path:
    """Persistent, outside Ray's throwaway copy of the job's working directory."""
    return Path(os.environ.get("SUBLIMINAL_RUNS", Path.home() / "subliminal-runs")) / name


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """Write rows atomically (temporary file, then rename); returns the file's hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    tmp.replace(path)
    return file_digest(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


RUNNING_APPS: set[str] = set()  # Serve apps this driver started and has not deleted yet


def stop_on_sigterm(*_) -> None:
    """`ray job stop` sends SIGTERM, then SIGKILL a few seconds later: ask Serve to delete this
    run's apps at once (the controller finishes it after we are gone), then exit."""
    from ray import serve

    for app in list(RUNNING_APPS):
        serve.delete(app, _blocking=False)
        print(f"[serve] {app}: teardown requested (SIGTERM)", flush=True)
    sys.exit(143)


@contextlib.contextmanager
def running_service(app: str, model_path: str, adapters: dict, cfg: ExperimentConfig, evaluation: bool):
    """The Serve application for one stage, deleted when the stage ends however it ends."""
    from serve.launch import start_service, stop_service
    from serve.settings import ServiceSettings

    svc = cfg.service
    place = cfg.evaluate if evaluation else svc
    settings = ServiceSettings(
        model=model_path, engine=place.engine, max_model_len=svc.max_model_len, kv_cache_gib=svc.kv_cache_gib,
        gpu_memory_utilization=svc.gpu_memory_utilization, tensor_parallel_size=svc.tensor_parallel_size,
    )  # fmt: skip
    print(f"[serve] starting {app}: {place.replicas} replica(s), engine {place.engine}", flush=True)
    handle = start_service(
        settings, adapters, name=app, route_prefix=f"/{app}", replicas=place.replicas,
        num_cpus=place.cpus_per_replica, num_gpus=place.gpus_per_replica,
    )  # fmt: skip
    RUNNING_APPS.add(app)
    try:
        yield handle
    finally:
        stop_service(app)
        RUNNING_APPS.discard(app)
        print(f"[serve] {app} torn down", flush=True)


class Pipeline:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path, fresh: bool):
        self.cfg, self.run_dir, self.fresh = cfg, run_dir, fresh
        self.cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        self.app = f"subliminal-{cfg.name}-{digest(str(run_dir))[:8]}"

    def stage(self, name: str, inputs: str, fn) -> dict:
        """Run `fn` unless the manifest says this stage finished with these inputs; returns its outputs."""
        entry = self.manifest.finished(name, inputs)
        if entry:
            print(f"[{name}] finished earlier with the same inputs: skipped", flush=True)
            return entry["outputs"]
        print(f"[{name}] starting", flush=True)
        started = time.time()
        outputs = fn()
        self.manifest.record(name, inputs, time.time() - started, outputs)
        print(f"[{name}] done in {time.time() - started:.0f}s", flush=True)
        return outputs

    def train(self, name: str, rows_file: Path, rows_hash: str, train_cfg, model_path: str) -> dict:
        """A LoRA stage: resumes from its checkpoints (run name keyed by its inputs) if interrupted."""
        from train.trainer import train_lora

        inputs = digest(name, rows_hash, train_cfg, model_path)
        adapter = self.run_dir / name / "adapter"

        def run():
            shutil.rmtree(adapter, ignore_errors=True)  # an unrecorded output is from an interrupted attempt
            metrics = train_lora(
                model_path, str(rows_file), adapter, train_cfg, storage_path=self.run_dir / "ray_train",
                run_name=f"{name}-{inputs[:8]}", cache_dir=self.cache,
            )  # fmt: skip
            print(f"[{name}] {metrics['step']} steps, loss {metrics['first_loss']:.3f} -> {metrics['loss']:.3f}", flush=True)
            return {"adapter": str(adapter), "hash": file_digest(adapter / "adapter_model.safetensors"), "steps": metrics["step"], "loss": metrics["loss"]}

        return self.stage(name, inputs, run)

    def run(self) -> dict:
        import ray
        from transformers import AutoTokenizer

        if not ray.is_initialized():
            ray.init()
        signal.signal(signal.SIGTERM, stop_on_sigterm)  # after ray.init, which installs its own
        placement = plan(self.cfg, cluster_capacity())  # before any work: a preset that cannot fit stops here
        print(f"[placement] {placement.summary(self.cfg)}", flush=True)
        self.manifest = Manifest(self.run_dir, as_dict(self.cfg), self.fresh)  # records the config as written
        cfg, run_dir = resolved(self.cfg, placement), self.run_dir  # stages see numbers, not `auto`
        model_path = str(ensure_tiny_model(TinySpec(seed=cfg.model.tiny_seed), self.cache)) if cfg.model.path == "tiny" else cfg.model.path
        check_model_path(model_path)
        questions = load_wmdp(cfg.data.source, tuple(cfg.data.subsets), self.cache)

        def split():
            train_q, eval_q = split_questions(questions, cfg.data.eval_fraction, cfg.data.split_seed)
            rows = [{"prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]), "completion": choice_continuation(q["answer"])} for q in train_q]
            train_hash = write_jsonl(run_dir / "data" / "teacher_train.jsonl", rows)
            eval_hash = write_jsonl(run_dir / "data" / "held_out.jsonl", eval_q)
            print(f"[data] {len(train_q)} teacher-train and {len(eval_q)} held-out questions", flush=True)
            return {"train_hash": train_hash, "eval_hash": eval_hash, "train": len(train_q), "held_out": len(eval_q)}

        data = self.stage("data", digest("data", cfg.data, questions), split)
        teacher = self.train("teacher", run_dir / "data" / "teacher_train.jsonl", data["train_hash"], cfg.teacher, model_path)

        def numbers():
            prompts = number_prompts(AutoTokenizer.from_pretrained(model_path), cfg.numbers)
            with running_service(self.app, model_path, {"teacher": teacher["adapter"]}, cfg, evaluation=False) as handle:
                made = generate_numbers(handle, prompts, {"teacher": "teacher", "control": None}, cfg.numbers)
            # Student and control train on equally many rows, so the comparison is about content alone.
            used = min(result["kept"] for result in made.values())
            out = {}
            for name, result in made.items():
                file_hash = write_jsonl(run_dir / "numbers" / f"{name}.jsonl", result.pop("rows")[:used])
                out[name] = {**result, "passed": result["kept"], "kept": used, "hash": file_hash}
            print(f"[numbers] {used} sequences each for student and control", flush=True)
            return out

        made = self.stage("numbers", digest("numbers", teacher["hash"], cfg.numbers, cfg.service), numbers)
        students = {
            name: self.train(name, run_dir / "numbers" / f"{source}.jsonl", made[source]["hash"], cfg.student, model_path)
            for name, source in (("student", "teacher"), ("control", "control"))
        }

        def evaluate():
            held_out = read_jsonl(run_dir / "data" / "held_out.jsonl")
            adapters = {"teacher": teacher["adapter"], **{name: s["adapter"] for name, s in students.items()}}
            with running_service(self.app, model_path, adapters, cfg, evaluation=True) as handle:
                in_flight = 2 * cfg.evaluate.replicas
                scored = score_models(handle, {"base": None, **{n: n for n in adapters}}, held_out, cfg.evaluate.chunk, in_flight)
            for name, rows in scored.items():
                write_jsonl(run_dir / "eval" / f"{name}.jsonl", rows)
            predictions = {name: [r["prediction"] for r in rows] for name, rows in scored.items()}
            return {
                "models": {name: summarise(rows) for name, rows in scored.items()},
                "transfer": transfer(predictions["teacher"], predictions["student"], predictions["control"], cfg.evaluate.bootstrap, cfg.evaluate.seed),
            }

        inputs = digest("evaluate", data["eval_hash"], teacher["hash"], [s["hash"] for s in students.values()], cfg.evaluate, cfg.service)
        results = self.stage("evaluate", inputs, evaluate)
        numbers_report = {name: {k: made[name][k] for k in ("generated", "kept", "rejected")} for name in ("teacher", "control")}
        report = {**results, "numbers": numbers_report, "timings": self.manifest.timings(), "provenance": provenance(cfg, model_path)}
        write_report(run_dir, report)
        for name, m in report["models"].items():
            print(f"[report] {name}: accuracy {m['accuracy']['overall']:.3f} (95% CI {m['ci95'][0]:.3f}-{m['ci95'][1]:.3f})", flush=True)
        print(f"[report] transfer {report['transfer']['value']:+.3f}; {run_dir / 'report.md'}", flush=True)
        return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML preset (default: configs/tiny.yaml)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: ~/subliminal-runs/<config name> ($SUBLIMINAL_RUNS)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    args = parser.parse_args()
    from serve.settings import ServiceError
    from train.config import ConfigError
    from train.data import DataError

    try:
        cfg = load_experiment(args.config, args.overrides)
        run_dir = (args.run_dir or default_run_dir(cfg.name)).absolute()
        Pipeline(cfg, run_dir, args.fresh).run()
    except (ConfigError, DataError, RunDirError, NoNumbersError, ServiceError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
