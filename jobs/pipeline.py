"""The subliminal-learning experiment as one Ray job, from teacher to report.

    python jobs/pipeline.py [--config configs/tiny.yaml] [--run-dir DIR] [--set key.path=value ...] [--fresh] [--plan]
    ray job submit --working-dir . -- python jobs/pipeline.py

With no arguments it runs the tiny preset (model and data built on first use)
on the Ray cluster it is submitted to, or on a local one it starts. Phases
(jobs/graph.py declares each stage's inputs):

1. data      WMDP questions split into teacher-train and held-out, disjoint by text
2. teacher   Ray Train LoRA on the train split (prompt = the WMDP question, completion = its letter);
             with it, when an arm needs it, the positive control's letter teacher (one run)
3. numbers   per replicate, the teacher and the base model continue number sequences through
             one Serve deployment, all replicates at once; completions are filtered
4. arms      every arm x replicate declared in the preset (jobs/arms.py), trained side by side:
             several adapters per Ray Train run over one copy of the base, several runs at once
             where the GPUs allow (jobs/placement.py); arms on another base model
             (jobs/bases.py) in runs of their own over that base
5. evaluate  every model scored on the train and held-out questions in parallel (and the
             snapshots of arms that keep them: transfer against training steps), one service
             per base model
6. report    report.json, report.md and its plots (transfer, accuracy, training) in the run directory (docs/report.md)

Before any work it prints the plan: each stage and whether it is reused or runs,
and why (`--plan` prints only that). A change reruns what depends on it and
nothing else; an interrupted stage resumes (training from its last checkpoint).
The Serve application is named after the run and torn down when a phase ends,
fails, or the job is stopped (`ray job stop`); one left behind by a driver
killed outright is deleted by the next run of the same command. One pipeline
at a time uses a run directory: a second one stops at once naming the holder
(jobs/run_lock.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python jobs/pipeline.py`: import from the repository root, not jobs/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from common.atomic import write_jsonl  # noqa: E402
from common.files import default_cache_dir, file_digest  # noqa: E402
from jobs.arms import OTHER_BASE, arm_models, numbers_seed  # noqa: E402
from jobs.bases import base_paths, check_kl_tokenizers  # noqa: E402
from jobs.config import ExperimentConfig, load_experiment  # noqa: E402
from jobs.evaluate import context_check, score_models, summarise  # noqa: E402
from jobs.generate_numbers import NoNumbersError, generate_all, number_prompts  # noqa: E402
from jobs.graph import PHASES, SPLIT_FILES, TEACHERS, experiment_stages, snapshot_points, training_rows  # noqa: E402
from jobs.job_log import quiet_driver, runtime_env  # noqa: E402
from jobs.manifest import Manifest, RunDirError, digest, read_jsonl  # noqa: E402
from jobs.number_sequences import shuffle_numbers  # noqa: E402
from jobs.placement import plan as place  # noqa: E402
from jobs.placement import resolved  # noqa: E402
from jobs.report import build_report, write_report  # noqa: E402
from jobs.run_lock import check_free, hold_run_dir  # noqa: E402
from jobs.service_session import delete_leftover_app, max_lora_rank, running_service, stop_on_sigterm  # noqa: E402
from jobs.stages import describe, plan  # noqa: E402
from jobs.wmdp import load_wmdp, split_questions  # noqa: E402
from serve.mc_format import LETTERS, choice_continuation, format_mc_prompt  # noqa: E402
from train.cluster import cluster_capacity  # noqa: E402
from train.model import check_model_path  # noqa: E402


def default_run_dir(name: str) -> Path:
    """Persistent, outside Ray's throwaway copy of the job's working directory."""
    return Path(os.environ.get("SUBLIMINAL_RUNS", Path.home() / "subliminal-runs")) / name


def arm_adapter(run_dir: Path, arm_model: str) -> Path:
    """Where arm model `<arm>/<i>` keeps its adapter."""
    return run_dir / "arms" / arm_model / "adapter"


def mc_rows(questions: list[dict], letter: int | None = None) -> list[dict]:
    """Teacher training rows: each question's WMDP prompt, completed by its answer (or by `letter`)."""
    return [
        {"prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]), "completion": choice_continuation(q["answer"] if letter is None else letter)}
        for q in questions
    ]


def arm_groups(pairs: list, runs: int, base_of) -> list[list]:
    """(stage, AdapterJob) pairs split into training runs: jobs that can share a worker group (the same
    base model, `base_of(stage)`, worker count, hardware, strategy...) go together, `runs` runs' worth
    at a time; under FSDP one job per run, since FSDP2 shards the adapter in place once."""
    from train.trainer import SHARED_KEYS

    kinds: dict[tuple, list] = {}
    for pair in pairs:
        kinds.setdefault((base_of(pair[0]), *(str(getattr(pair[1].cfg, k)) for k in SHARED_KEYS)), []).append(pair)
    groups = []
    for members in kinds.values():
        per_run = 1 if members[0][1].cfg.strategy == "fsdp" else -(-len(members) // runs)
        groups += [members[i : i + per_run] for i in range(0, len(members), per_run)]
    return groups


class Pipeline:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path, fresh: bool = False):
        self.cfg, self.run_dir, self.fresh = cfg, run_dir, fresh
        self.cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        self.app = f"subliminal-{cfg.name}-{digest(str(run_dir))[:8]}"
        self.models = {m.name: m for m in arm_models(cfg)}
        self.lora_rank = max_lora_rank([cfg.teacher.lora_rank] + [m.train.lora_rank for m in self.models.values()])

    def stages(self):
        """Every stage, declared from the config as written (jobs/graph.py)."""
        self.questions = load_wmdp(self.cfg.data.source, tuple(self.cfg.data.subsets), self.cache)
        return experiment_stages(self.cfg, list(self.models.values()), digest(self.questions))

    def show_plan(self) -> str:
        """The plan for this run directory, without doing anything (`--plan`)."""
        manifest = Manifest(self.run_dir)
        return describe(plan(self.stages(), manifest))

    def record(self, stage, started: float, outputs: dict, files=()) -> None:
        """Record a finished stage with the digests of its output files: those it declares, and `files`."""
        self.manifest.record(stage.name, stage.inputs(self.manifest), time.time() - started, outputs, (*stage.files, *files))
        print(f"[{stage.phase}] {stage.name} done in {time.time() - started:.0f}s", flush=True)

    def run(self) -> dict:
        import ray

        check_free(self.run_dir)  # a run directory another pipeline holds stops here, before Ray starts
        quiet_driver()  # a readable log: Ray's progress bars and per-dataset lines off (jobs/job_log.py)
        if not ray.is_initialized():
            ray.init(runtime_env=runtime_env())
        signal.signal(signal.SIGTERM, stop_on_sigterm)  # after ray.init, which installs its own
        placement = place(self.cfg, cluster_capacity())  # before any work: a preset that cannot fit stops here
        print(f"[placement] {placement.summary(self.cfg)}", flush=True)
        self.arm_runs = placement.arm_runs
        with hold_run_dir(self.run_dir):  # one pipeline per run directory, from here until the run ends
            return self.run_held(placement)

    def run_held(self, placement) -> dict:
        """The rest of `run`, with the run directory held: --fresh clears it, the plan, every phase with work."""
        self.manifest = Manifest(self.run_dir, self.fresh)
        delete_leftover_app(self.app)  # before any work: a killed driver's replicas may hold GPUs
        stages = self.stages()
        print(f"[plan] {describe(plan(stages, self.manifest))}", flush=True)
        self.cfg = resolved(self.cfg, placement)  # stages see numbers, not `auto`
        self.paths = base_paths(self.cfg, self.cache)  # {"base": ..., "other_base": ... when an arm declares one}
        self.model_path = self.paths["base"]
        for path in self.paths.values():
            check_model_path(path)
        check_kl_tokenizers(self.cfg, self.paths)
        print(f"[evaluate] {context_check(self.model_path, self.questions, self.cfg.service.max_model_len)}", flush=True)
        for phase in PHASES:
            todo = [stage for stage, run, _ in plan(stages, self.manifest) if run and stage.phase == phase]
            if todo:
                print(f"[{phase}] starting {len(todo)} stage(s)", flush=True)
                started = time.time()
                getattr(self, f"run_{phase}")(todo)
                seconds = time.time() - started
                self.manifest.record_phase(phase, seconds)
                print(f"[{phase}] {len(todo)} stage(s) done in {seconds:.0f}s", flush=True)
        report = json.loads((self.run_dir / "report.json").read_text())
        for name, m in report["models"].items():
            ci = f"95% CI {m['ci95'][0]:.3f}-{m['ci95'][1]:.3f}" if m["ci95"] else "no CI with one replicate"
            print(f"[report] {name}: accuracy {m['accuracy']['overall']:.3f} ({ci})", flush=True)
        if "transfer" in report:
            print(f"[report] transfer {report['transfer']['value']:+.3f}; {self.run_dir / 'report.md'}", flush=True)
        return report

    # Phases: each runs the given stages and records each one in the manifest -------------------

    def run_data(self, todo) -> None:
        started, cfg = time.time(), self.cfg
        train_q, eval_q = split_questions(self.questions, cfg.data.eval_fraction, cfg.data.split_seed)
        train_hash = write_jsonl(self.run_dir / "data" / "teacher_train.jsonl", mc_rows(train_q))
        questions_hash = write_jsonl(self.run_dir / "data" / "train_questions.jsonl", train_q)  # scored too
        eval_hash = write_jsonl(self.run_dir / "data" / "held_out.jsonl", eval_q)
        print(f"[data] {len(train_q)} teacher-train and {len(eval_q)} held-out questions", flush=True)
        self.record(todo[0], started, {"hash": digest(train_hash, questions_hash, eval_hash), "train": len(train_q), "held_out": len(eval_q)})

    def run_teacher(self, todo) -> None:
        """The teacher, and the letter teacher of the positive control when an arm needs it: one
        Ray Train run (they share every setting), from the same LoRA init."""
        from train.trainer import AdapterJob, clear_stale_outputs, train_lora_many

        started, jobs = time.time(), []
        for stage in todo:
            data = self.run_dir / "data" / "teacher_train.jsonl"
            if stage.name == "letter_teacher":  # every teacher-train question answered with one letter
                data = self.run_dir / "letter_teacher" / "train.jsonl"
                questions = read_jsonl(self.run_dir / "data" / "train_questions.jsonl")
                write_jsonl(data, mc_rows(questions, LETTERS.index(self.cfg.letter_teacher.letter)))
            jobs.append(AdapterJob(stage.name, str(data), self.run_dir / stage.name / "adapter", self.cfg.teacher))
        run = {"storage_path": self.run_dir / "ray_train", "run_name": self.training_run("teacher", todo)}
        clear_stale_outputs(jobs, **run)
        results = train_lora_many(self.model_path, jobs, cache_dir=self.cache, **run)
        for stage, job in zip(todo, jobs):
            metrics = results[job.name]
            print(f"[teacher] {stage.name}: {metrics['step']} steps, loss {metrics['first_loss']:.3f} -> {metrics['loss']:.3f}", flush=True)
            self.record(stage, started, self.adapter_outputs(job.output_dir, metrics))

    def training_run(self, prefix: str, stages) -> str:
        """The name of the Ray Train run that makes `stages`: keyed by their inputs, so an interrupted run
        resumes where it stopped; and by the outputs they replace, so retraining a stage whose adapter
        was damaged (same inputs) starts a new run, rather than finding the old one finished and
        keeping the damaged folder."""
        replaced = [entry["outputs"]["hash"] for stage in stages if (entry := self.manifest.entry(stage.name))]
        return f"{prefix}-{digest([stage.inputs(self.manifest) for stage in stages], *replaced)[:8]}"

    @staticmethod
    def adapter_outputs(adapter: Path, metrics: dict) -> dict:
        return {
            "hash": file_digest(adapter / "adapter_model.safetensors"), "steps": metrics["step"], "loss": metrics["loss"],
            "init_hash": metrics["init_hash"], "rows": metrics["rows"], "snapshot_steps": metrics.get("snapshot_steps", []),
        }  # fmt: skip

    def run_numbers(self, todo) -> None:
        """Every (source, replicate) still to make, through one service, all at once."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        jobs = []
        for stage in todo:
            _, source, replicate = stage.name.split("/")
            numbers = dataclasses.replace(self.cfg.numbers, seed=numbers_seed(self.cfg, int(replicate)))
            jobs.append((stage, "teacher" if source == "teacher" else None, numbers, number_prompts(tokenizer, numbers)))
        adapters = {"teacher": str(self.run_dir / "teacher" / "adapter")} if any(adapter for _, adapter, _, _ in jobs) else {}
        errors = []
        with running_service(self.app, self.model_path, adapters, self.cfg, False, self.lora_rank) as handle:
            started = time.time()
            for name, result in generate_all(handle, {stage.name: (prompts, adapter, numbers) for stage, adapter, numbers, prompts in jobs}):
                if isinstance(result, NoNumbersError):
                    errors.append(result)
                    continue
                file_hash = write_jsonl(self.run_dir / f"{name}.jsonl", result.pop("rows"))
                self.record(next(s for s in todo if s.name == name), started, {**result, "hash": file_hash})
        if errors:
            raise errors[0]

    def run_arms(self, todo) -> None:
        """Arm x replicate adapters: several per Ray Train run over one copy of the base (one per run
        under FSDP), and as many runs at once as placement allows."""
        from train.trainer import AdapterJob

        started, pairs = time.time(), []
        for stage in todo:
            m = self.models[stage.name]
            rows = training_rows(self.manifest, list(self.models.values()), m.replicate)
            data = self.run_dir / "arms" / m.name / "train.jsonl"
            kept = read_jsonl(self.run_dir / "numbers" / m.source / f"{m.replicate}.jsonl")[:rows]
            write_jsonl(data, shuffle_numbers(kept, numbers_seed(self.cfg, m.replicate)) if m.shuffled else kept)
            # Job names key Ray datasets, whose log files are named after them: no '/' (m.adapter is "<arm>-<i>").
            teacher = str(self.run_dir / m.teacher / "adapter")
            job = AdapterJob(m.adapter, str(data), arm_adapter(self.run_dir, m.name), m.train)
            if m.loss == "logit_kl":  # on another base, the teacher's targets come from its own base
                job = dataclasses.replace(job, teacher=teacher, teacher_base=self.model_path if m.base == OTHER_BASE else None)
            if m.lora_init == "teacher_a":
                job = dataclasses.replace(job, init_a_from=teacher)
            pairs.append((stage, job))
        for stage, metrics in self.train_groups(arm_groups(pairs, self.arm_runs, lambda stage: self.models[stage.name].base)):
            print(f"[arms] {stage.name}: {metrics['step']} steps, loss {metrics['first_loss']:.3f} -> {metrics['loss']:.3f}", flush=True)
            self.record(stage, started, self.adapter_outputs(arm_adapter(self.run_dir, stage.name), metrics))

    def train_groups(self, groups):
        """Yields (stage, metrics) for every job of every group: one train_lora_many call per group,
        in this driver when runs go one at a time, else as Ray tasks, `arm_runs` at once. A group's
        run name is keyed by its members' inputs, so an interrupted group resumes where it stopped."""
        import ray

        from train.trainer import clear_stale_outputs, train_lora_many

        def call(group):
            jobs = [job for _, job in group]
            kwargs = {"storage_path": self.run_dir / "ray_train", "cache_dir": self.cache}
            kwargs["run_name"] = self.training_run("arms", [stage for stage, _ in group])
            clear_stale_outputs(jobs, **kwargs)
            return self.paths[self.models[group[0][0].name].base], jobs, kwargs

        if self.arm_runs == 1:
            for group in groups:
                base, jobs, kwargs = call(group)
                results = train_lora_many(base, jobs, **kwargs)
                yield from ((stage, results[job.name]) for stage, job in group)
            return
        remote, pending = ray.remote(num_cpus=0)(train_lora_many), {}
        for group in groups:
            if len(pending) == self.arm_runs:
                yield from self._finished_group(pending)
            base, jobs, kwargs = call(group)
            pending[remote.remote(base, jobs, **kwargs)] = group
        while pending:
            yield from self._finished_group(pending)

    @staticmethod
    def _finished_group(pending: dict):
        import ray

        (ref,), _ = ray.wait(list(pending), num_returns=1)
        group, results = pending.pop(ref), ray.get(ref)
        return [(stage, results[job.name]) for stage, job in group]

    def run_evaluate(self, todo) -> None:
        """Every model still to score, through one service per base model (the other base's after the
        teacher's): the base itself, and the adapters over it with their earlier snapshots."""
        started = time.time()
        names = [stage.name.split("/", 1)[1] for stage in todo]
        snapshots = {n: [point for point in snapshot_points(self.manifest, n) if point[1] != n] for n in names if n in self.models}
        questions = [{**q, "split": split} for split, file in SPLIT_FILES.items() for q in read_jsonl(self.run_dir / "data" / file)]
        scored = {}
        for base in self.paths:
            targets, adapters = self.scoring_targets(base, names, snapshots)
            if targets:
                with running_service(self.app, self.paths[base], adapters, self.cfg, True, self.lora_rank) as handle:
                    scored.update(score_models(handle, targets, questions, self.cfg.evaluate.chunk, 2 * self.cfg.evaluate.replicas))
        for stage, name in zip(todo, names):
            hashes = [write_jsonl(self.run_dir / "eval" / f"{scored_name}.jsonl", scored[scored_name]) for _, scored_name in snapshots.get(name, [])]
            file_hash = write_jsonl(self.run_dir / "eval" / f"{name}.jsonl", scored[name])
            held_out = [r for r in scored[name] if r["split"] == "held_out"]
            snapshot_files = [f"eval/{scored_name}.jsonl" for _, scored_name in snapshots.get(name, [])]
            self.record(stage, started, {"hash": digest(file_hash, *hashes) if hashes else file_hash, **summarise(held_out)}, snapshot_files)

    def scoring_targets(self, base: str, names: list[str], snapshots: dict) -> tuple[dict, dict]:
        """({scored name: adapter or None for the base itself}, {adapter: folder}) of the models over
        `base` ("base" or "other_base"), with the earlier snapshots of arms that keep them."""
        targets, adapters = {}, {}
        for n in names:
            if n == base:
                targets[n] = None
            elif n in TEACHERS and base == "base":
                targets[n], adapters[n] = n, str(self.run_dir / n / "adapter")
            elif n in self.models and self.models[n].base == base:
                m = self.models[n]
                targets[n], adapters[m.adapter] = m.adapter, str(arm_adapter(self.run_dir, n))
                for step, scored_name in snapshots[n]:  # earlier snapshots, for transfer against training steps
                    targets[scored_name] = f"{m.adapter}-step{step}"
                    adapters[targets[scored_name]] = str(arm_adapter(self.run_dir, n) / "snapshots" / f"step-{step}")
        return targets, adapters

    def run_report(self, todo) -> None:
        started = time.time()
        report = build_report(self.run_dir, self.cfg, list(self.models.values()), self.manifest, self.paths)
        write_report(self.run_dir, report)
        self.record(todo[0], started, {"hash": file_digest(self.run_dir / "report.json")})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML preset (default: configs/tiny.yaml)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default: ~/subliminal-runs/<config name> ($SUBLIMINAL_RUNS)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    parser.add_argument("--plan", action="store_true", help="print which stages would be reused or run, and why; run nothing")
    args = parser.parse_args()
    from serve.settings import ServiceError
    from train.config import ConfigError
    from train.data import DataError

    try:
        cfg = load_experiment(args.config, args.overrides)
        run_dir = (args.run_dir or default_run_dir(cfg.name)).absolute()
        pipeline = Pipeline(cfg, run_dir, args.fresh)
        if args.plan:
            print(pipeline.show_plan() if not args.fresh else "--fresh: every stage runs")
        else:
            pipeline.run()
    except (ConfigError, DataError, RunDirError, NoNumbersError, ServiceError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
