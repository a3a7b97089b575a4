"""Any preset's compute floor: each phase's work timed in one plain process, beside the run's time.

    .venv/bin/python jobs/pipeline.py --config PRESET --run-dir DIR        # a finished run of any preset
    .venv/bin/python bench/compute_floor.py --run-dir DIR [--json bench/results/compute_floor.json]

A run of teacher–sham pairs (a preset listing `pairs`) is one run per pair under DIR/pairs/<p>:
its floor and its time are the pairs' summed, phase by phase. The floor is timed under the
numerics mode the run was made in (its provenance; the process runs itself again pinned when the
run was, common/numerics.py), so a pinned preset is held to a pinned floor.

From a finished run directory it reads the config the run was made with (its report's provenance)
and the work each phase did: every trained model's optimizer steps (teachers and arm models, as
their train_metrics.json record them), the sequences each kind of numbers generated, the questions
scored. It times a sample of that work in this one process, on the same inputs, through the
project's own arithmetic: a training step as the workers take it (pack_batch, forward_loss with
the logit-KL targets where the loss reads them, backward, clipping, the configured optimizer) over
a whole global batch, once per distinct step (the training settings bar the seeds, the base, the
loss, the kind of rows); seeded generation through HFEngine, once per (whose adapter, temperature);
cloze scoring through HFEngine.score_continuations with an adapter, in the phase's chunks. Each rate
times its count of that work is its floor, twice:

- one process: the rates at torch's threads (one per core), as the floor was first defined;
- per core: the rates at one thread (as Ray runs each worker and replica), the work divided over
  every core with no cost to share it. On a small model one process's threads use the cores
  worse than one-thread processes side by side, so this is the lower of the two, and the one a
  run's time is held to (1.5x: BENCHMARKS.md).

Not in either floor, so a ratio over it errs high: the teacher passes that make logit-KL targets
and divergence masks (forward passes over each job's rows, cached across runs). A rewritten kind's
stages (`teacher_replaced`), the teachers' answers, data and report count at their own time. No
Ray, no Serve, no process started: what is left of a phase's time is the pipeline's overhead
(start-up, model loads, waits, teardown), which the run's timeline (report.json `timeline`,
timeline.png) breaks down. Results: BENCHMARKS.md, "Every preset against its compute floor".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from common import numerics
from common.config import build
from jobs.experiment.arms import OTHER_BASE, arm_models
from jobs.experiment.config import ExperimentConfig
from jobs.experiment.rows_kinds import KINDS
from jobs.experiment.stages import TEACHER_TRAIN, trained_folder
from jobs.phases.numbers import numbers_request
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest, read_jsonl
from serve.cloze import cloze_parts
from serve.engine import Sampling
from serve.hf_engine import HFEngine
from serve.mc_format import format_cloze_prompt
from serve.settings import ServiceSettings
from train.config import TrainConfig
from train.data import TEACHER_COLUMN, Tokenize, pack_batch
from train.distill import number_token_ids, row_targets
from train.model import attach_lora, load_base
from train.step import apply_step, forward_loss, make_optimizer
from train.teacher_pass import TeacherPass, load_teacher

CPU = torch.device("cpu")


@dataclass(frozen=True)
class Trained:
    """One model a run trained: its steps, and what one of its steps computes."""

    name: str
    steps: int
    cfg: TrainConfig
    global_batch: int
    model_path: str  # the base it trained on
    rows_file: Path
    teacher: str | None  # logit_kl: the adapter whose targets its loss reads
    teacher_base: str | None
    rows_kind: str  # a teacher's: "questions"; an arm model's: the kind of rows it reads

    def step_key(self) -> str:
        """What sets a step's cost: the settings bar the seeds, the base, the loss, the kind of rows."""
        settings = self.cfg.model_dump(exclude={"seed", "lora_seed"})
        return json.dumps(
            [settings, self.global_batch, self.model_path, self.teacher is not None, self.rows_kind], default=str
        )


def trained_models(run_dir: Path, cfg: ExperimentConfig, manifest: Manifest, paths: dict[str, str]) -> list[Trained]:
    """Every teacher and arm model the run trained, from the settings its training recorded."""
    arms = {m.name: m for m in arm_models(cfg)}
    out = []
    for name, entry in manifest.data["stages"].items():
        if "steps" not in entry.get("outputs", {}):
            continue
        m = arms.get(name)
        if m is None:  # a teacher: the data stage's rows, or its own (sham, letter)
            rows = run_dir / (TEACHER_TRAIN if name == "teacher" else f"{name}/train.jsonl")
            base, teacher, kind = "base", None, "questions"
        else:
            rows, base, kind = run_dir / "arms" / name / "train.jsonl", m.base, m.source
            teacher = str(run_dir / trained_folder(m.teacher)) if m.loss == "logit_kl" else None
        folder = run_dir / trained_folder(name, m is not None and m.full)
        metrics = json.loads((folder / "train_metrics.json").read_text())
        settings = TrainConfig.model_validate(metrics["train_config"])
        out.append(
            Trained(
                name,
                entry["outputs"]["steps"],
                settings,
                metrics["global_batch_size"],
                paths[base],
                rows,
                teacher,
                paths["base"] if teacher else None,
                kind,
            )
        )
    return out


def step_seconds(job: Trained, steps: int) -> float:
    """Seconds per optimizer step of `job` over its own rows, the best of `steps` after one warm-up."""
    cfg = job.cfg
    base = load_base(job.model_path, cfg, CPU)
    model = attach_lora(base, cfg) if cfg.method == "lora" else base
    tokenize = Tokenize(job.model_path, cfg.max_length, cfg.too_long)
    rows = read_jsonl(job.rows_file)
    tokens = tokenize(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    ).to_pydict()
    pad = tokenize.tok.pad_token_id if tokenize.tok.pad_token_id is not None else tokenize.tok.eos_token_id
    number_ids = None
    if job.teacher:  # logit_kl: its batches carry the teacher's targets (made here, not timed)
        number_ids = torch.tensor(number_token_ids(tokenize.tok))
        teacher = load_teacher(TeacherPass(job.teacher_base, job.teacher, cfg, tuple(number_ids.tolist())), CPU)
        tokens[TEACHER_COLUMN] = row_targets(teacher, list(zip(tokens["input_ids"], tokens["labels"])), number_ids, pad)
        del teacher
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params, cfg, CPU)
    model.train()
    times = []
    for i in range(steps + 1):
        batch = {k: v[(i * job.global_batch) % len(rows) :][: job.global_batch] for k, v in tokens.items()}
        started = time.perf_counter()
        for micro in range(0, job.global_batch, cfg.batch_size):  # the workers' micro-batches, one after another
            part = {k: v[micro : micro + cfg.batch_size] for k, v in batch.items()}
            forward_loss(model, pack_batch(part, cfg.max_length, pad), number_ids).backward()
        apply_step(params, opt, cfg.max_grad_norm)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def training_floor(jobs: list[Trained], steps: int) -> tuple[float, str]:
    """(seconds, what) of every job's steps at its kind of step's rate, each kind timed once."""
    rates: dict[str, float] = {}
    for job in jobs:
        if job.step_key() not in rates:
            rates[job.step_key()] = step_seconds(job, steps)
    floor = sum(job.steps * rates[job.step_key()] for job in jobs)
    n = sum(job.steps for job in jobs)
    return floor, f"{n} steps of {len(rates)} kinds, {min(rates.values()):.3f}-{max(rates.values()):.3f} s a step"


def generation_seconds(engine: HFEngine, cfg, source: str, adapter: str | None, prompts: int) -> float:
    """Seconds per sequence of a sampled kind (its adapter and temperature), in the phase's chunks."""
    texts, _, numbers = numbers_request(engine.tokenizer, cfg, source, 0)
    texts = texts[:prompts]
    sampling = Sampling(max_tokens=numbers.max_tokens, temperature=numbers.temperature, seed=numbers.seed)
    chunk = cfg.numbers.chunk
    asyncio.run(engine.generate(texts[:chunk], sampling, adapter))  # warm-up
    started = time.perf_counter()
    for start in range(0, len(texts), chunk):
        asyncio.run(engine.generate(texts[start : start + chunk], sampling, adapter))
    return (time.perf_counter() - started) / len(texts)


def scoring_seconds(engine: HFEngine, questions: list[dict], adapter: str, chunk: int, max_len: int) -> float:
    """Seconds per question scored as cloze (each choice's text after the question), in the phase's chunks."""

    def score(part: list[dict]) -> None:
        prompts = [format_cloze_prompt(q["question"], q["subset"]) for q in part]
        ids, continuations, _ = cloze_parts(
            engine.counting_tokenizer, prompts, [q["choices"] for q in part], max_len, True
        )
        asyncio.run(engine.score_continuations(ids, continuations, adapter))

    score(questions[:chunk])  # warm-up
    started = time.perf_counter()
    for start in range(0, len(questions), chunk):
        score(questions[start : start + chunk])
    return (time.perf_counter() - started) / len(questions)


def numbers_floor(engine: HFEngine, cfg, stages: dict, prompts: int, spread: int) -> tuple[float, str]:
    """(seconds, what) of the numbers phase: each sampled kind's sequences at its (adapter,
    temperature)'s rate, each timed once; a rewritten kind's stages and the teachers' answers at
    their own time (their work is not timed apart)."""
    rates: dict[tuple, float] = {}
    floor, generated, own = 0.0, 0, 0.0
    for name, entry in stages.items():
        kind = name.split("/")[0]
        if kind == "answers" or (kind == "numbers" and KINDS[name.split("/")[1]].made == "rewritten"):
            own += entry.get("seconds", 0.0)
            continue
        if kind != "numbers":
            continue
        source = name.split("/")[1]
        _, adapter, numbers = numbers_request(engine.tokenizer, cfg, source, 0)
        key = (adapter, numbers.temperature)
        if key not in rates:
            rates[key] = generation_seconds(engine, cfg, source, adapter, prompts)
        floor += entry["outputs"]["generated"] * rates[key]
        generated += entry["outputs"]["generated"]
    what = f"{generated} sequences at {', '.join(f'{1000 * r:.1f}' for r in rates.values())} ms"
    return floor / spread + own, what + (f"; rewritten and answers {own:.1f} s as run" if own else "")


def floors(run_dir: Path, sample_steps: int, sample_prompts: int, spread: int = 1) -> dict:
    """{phase: {work, floor_s, run_s}} for a finished run of any preset, at this process's torch
    threads, the timed work divided over `spread` such processes (perfectly: no overhead at all)."""
    provenance = Report.load(run_dir / "report.json").provenance
    cfg = build(ExperimentConfig, provenance.config)
    paths = {"base": provenance.model_path} | (
        {OTHER_BASE: provenance.other_base_path} if provenance.other_base_path else {}
    )
    manifest = Manifest(run_dir)
    stages, timings = manifest.data["stages"], manifest.timings()
    trained = trained_models(run_dir, cfg, manifest, paths)
    teachers = [t for t in trained if t.name not in {m.name for m in arm_models(cfg)}]
    arms = [t for t in trained if t not in teachers]
    scored = sum(len(read_jsonl(path)) for path in (run_dir / "eval").rglob("*.jsonl"))

    teacher_floor, teacher_work = training_floor(teachers, sample_steps)
    arms_floor, arms_work = training_floor(arms, sample_steps)
    engine = HFEngine(paths["base"], ServiceSettings(engine="hf", model=paths["base"]))
    for t in teachers:
        asyncio.run(engine.add_adapter(t.name, str(run_dir / trained_folder(t.name))))
    numbers_s, numbers_work = numbers_floor(engine, cfg, stages, sample_prompts, spread)
    questions = read_jsonl(run_dir / "data" / "held_out.jsonl")
    per_question = scoring_seconds(engine, questions, "teacher", cfg.evaluate.chunk, cfg.service.max_model_len)
    engine.shutdown()

    def row(work: str, floor: float, phase: str) -> dict:
        return {"work": work, "floor_s": floor, "run_s": timings.get(phase, 0.0)}

    return {
        "data": row("split the questions", timings.get("data", 0.0), "data"),
        "teacher": row(teacher_work, teacher_floor / spread, "teacher"),
        "numbers": row(numbers_work, numbers_s, "numbers"),
        "arms": row(arms_work, arms_floor / spread, "arms"),
        "evaluate": row(
            f"{scored} questions at {per_question * 1000:.2f} ms", scored * per_question / spread, "evaluate"
        ),
        "report": row("tables and plots", timings.get("report", 0.0), "report"),
    }


def run_dirs(run_dir: Path) -> list[Path]:
    """The run directories a finished run is made of: each pair's, for a run of pairs; else its own."""
    pairs = run_dir / "pairs"
    return (
        sorted((p for p in pairs.iterdir() if p.is_dir()), key=lambda p: int(p.name)) if pairs.is_dir() else [run_dir]
    )


def summed(tables: list[dict]) -> dict:
    """Per-phase tables of several runs (pairs) as one: seconds added, each run's work listed."""
    if len(tables) == 1:
        return tables[0]
    return {
        phase: {
            key: sum(t[phase][key] for t in tables)
            if key.endswith("_s")
            else " + ".join(f"{t[phase][key]}" for t in tables)
            for key in tables[0][phase]
        }
        for phase in tables[0]
    }


def outside_phases(dirs: list[Path]) -> float:
    """Seconds of a run in none of its phases, none of it work: the driver's start before the first
    phase, and between pairs the next pair's checks (each later pair's own `start` span counts from
    the driver's start, so it holds the pairs before it)."""
    total, end = 0.0, None
    for d in dirs:
        spans = Manifest(d).phase_spans()
        phases = [span for name, span in spans.items() if name != "start"]
        if not phases:
            continue
        first = min(span["started"] for span in phases)
        total += first - (end if end is not None else spans.get("start", {"started": first})["started"])
        end = max(span["started"] + span["seconds"] for span in phases)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished run directory, of any preset")
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps timed per kind of step (the best is kept)"
    )
    parser.add_argument("--prompts", type=int, default=256, help="number prompts generated to time each kind")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args()
    dirs = run_dirs(args.run_dir)
    mode = (Report.load(dirs[0] / "report.json").provenance.numerics or {}).get("mode", numerics.DEFAULT)
    numerics.enter(mode, reexec=True)  # torch's threads: one per core natively, the pinned count pinned
    torch.manual_seed(0)
    transformers.logging.disable_progress_bar()
    cores = torch.get_num_threads()
    table = summed([floors(d, args.steps, args.prompts) for d in dirs])
    torch.set_num_threads(1)  # as Ray runs each worker and replica: one thread, one core each
    per_core = summed([floors(d, args.steps, args.prompts, spread=cores) for d in dirs])
    for phase, row in table.items():
        row["per_core_floor_s"], row["per_core_work"] = per_core[phase]["floor_s"], per_core[phase]["work"]
    start = outside_phases(dirs)
    table["start"] = {"work": "none (interpreter, imports, Ray, the plan)", "floor_s": 0.0, "run_s": start}
    table["start"]["per_core_floor_s"] = 0.0
    print(f"numerics {mode}; {len(dirs)} run(s): {', '.join(str(d) for d in dirs)}")
    print(
        f"{'phase':<9} {'per-core':>8} {'1-proc':>7} {'run s':>7} {'ratios':>11}  work (one process, {cores} threads)"
    )
    for phase, row in table.items():
        ratios = [row["run_s"] / f if f else float("nan") for f in (row["per_core_floor_s"], row["floor_s"])]
        print(
            f"{phase:<9} {row['per_core_floor_s']:8.1f} {row['floor_s']:7.1f} {row['run_s']:7.1f} "
            f"{ratios[0]:5.2f} {ratios[1]:5.2f}  {row['work']}"
        )
    floor, run = sum(r["floor_s"] for r in table.values()), sum(r["run_s"] for r in table.values())
    tight = sum(r["per_core_floor_s"] for r in table.values())
    print(f"{'total':<9} {tight:8.1f} {floor:7.1f} {run:7.1f} {run / tight:5.2f} {run / floor:5.2f}")
    if args.json:
        summary = {"floor_s": floor, "per_core_floor_s": tight, "run_s": run, "cores": cores, "numerics": mode}
        args.json.write_text(json.dumps({"run_dir": str(args.run_dir), "phases": table} | summary, indent=2))


if __name__ == "__main__":
    main()
