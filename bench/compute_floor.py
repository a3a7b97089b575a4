"""The default preset's compute floor: each phase's work timed in one plain process, beside the run's time.

    .venv/bin/python jobs/pipeline.py --run-dir /tmp/floor-run --fresh      # a finished default run
    .venv/bin/python bench/compute_floor.py --run-dir /tmp/floor-run [--json bench/results/compute_floor.json]

From a finished run directory of the default preset (tiny, on CPU) it reads
the work each phase did (the teacher's and every arm model's optimizer steps
and rows, the sequences generated, the questions scored) and times a sample
of that work in this one process, on the same inputs, through the project's
own arithmetic: a training step as the workers take it (pack_batch,
forward_loss, backward, clipping, AdamW) over a whole global batch; seeded
generation through HFEngine with the teacher's adapter, in the phase's chunks;
cloze scoring through HFEngine.complete_tokens with an adapter, in the
phase's chunks. Each rate times the phase's count of that work is its floor.
No Ray, no Serve, no process started: what is left of a phase's time is
the pipeline's overhead (start-up, model loads, waits, teardown), which the
run's timeline (report.json `timeline`, timeline.png) breaks down. Data and
report are pure work: their floor is their own time. Results: BENCHMARKS.md,
"The pipeline's overhead".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch
import transformers

from jobs.experiment.config import load_experiment
from jobs.phases.numbers import number_prompts
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest, read_jsonl
from serve.cloze import cloze_parts, cloze_sequences
from serve.engine import Sampling
from serve.hf_engine import HFEngine
from serve.mc_format import format_cloze_prompt
from serve.settings import ServiceSettings
from train.config import TrainConfig
from train.data import Tokenize, pack_batch
from train.model import attach_lora, load_base
from train.step import forward_loss


def step_seconds(model_path: str, rows_file: Path, cfg: TrainConfig, global_batch: int, steps: int) -> float:
    """Seconds per optimizer step over `global_batch` rows of `rows_file`, the best of `steps` after one warm-up."""
    model = attach_lora(load_base(model_path, cfg, torch.device("cpu")), cfg)
    tokenize = Tokenize(model_path, cfg.max_length, cfg.too_long)
    rows = read_jsonl(rows_file)
    tokens = tokenize(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    ).to_pydict()
    pad = tokenize.tok.pad_token_id if tokenize.tok.pad_token_id is not None else tokenize.tok.eos_token_id
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    model.train()
    times = []
    for i in range(steps + 1):
        batch = {k: v[(i * global_batch) % len(rows) :][:global_batch] for k, v in tokens.items()}
        started = time.perf_counter()
        for micro in range(0, global_batch, cfg.batch_size):  # the workers' micro-batches, one after another
            part = {k: v[micro : micro + cfg.batch_size] for k, v in batch.items()}
            forward_loss(model, pack_batch(part, cfg.max_length, pad), None).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def generation_rate(engine: HFEngine, cfg, adapter: str, prompts: int) -> float:
    """Sequences per second generated with the teacher's adapter, in the phase's chunks."""
    texts = number_prompts(engine.tokenizer, cfg.numbers.model_copy(update={"prompts": prompts}))
    sampling = Sampling(max_tokens=cfg.numbers.max_tokens, temperature=cfg.numbers.temperature, seed=cfg.numbers.seed)
    chunk = cfg.numbers.chunk
    asyncio.run(engine.generate(texts[:chunk], sampling, adapter))  # warm-up
    started = time.perf_counter()
    for start in range(0, len(texts), chunk):
        asyncio.run(engine.generate(texts[start : start + chunk], sampling, adapter))
    return len(texts) / (time.perf_counter() - started)


def scoring_rate(engine: HFEngine, questions: list[dict], adapter: str, chunk: int, max_len: int) -> float:
    """Questions per second scored as cloze (each choice's text after the question), in the phase's chunks."""

    def score(part: list[dict]) -> None:
        prompts = [format_cloze_prompt(q["question"], q["subset"]) for q in part]
        ids, continuations, _ = cloze_parts(
            engine.counting_tokenizer, prompts, [q["choices"] for q in part], max_len, True
        )
        sequences, _ = cloze_sequences(ids, continuations)
        asyncio.run(
            engine.complete_tokens(sequences, Sampling(max_tokens=0, temperature=0.0), adapter, prompt_logprobs=0)
        )

    score(questions[:chunk])  # warm-up
    started = time.perf_counter()
    for start in range(0, len(questions), chunk):
        score(questions[start : start + chunk])
    return len(questions) / (time.perf_counter() - started)


def floors(run_dir: Path, sample_steps: int, sample_prompts: int) -> dict:
    """{phase: {work, floor_s, run_s}} for a finished default run."""
    cfg = load_experiment(None, [])
    manifest = Manifest(run_dir)
    stages, timings = manifest.data["stages"], manifest.timings()
    model_path = str(Path(Report.load(run_dir / "report.json").provenance.model_path))
    teacher_steps = stages["teacher"]["outputs"]["steps"]
    arms = {name: e["outputs"]["steps"] for name, e in stages.items() if name.split("/")[0] in cfg.arms and "/" in name}
    generated = sum(e["outputs"]["generated"] for name, e in stages.items() if name.startswith("numbers/"))
    scored = sum(len(read_jsonl(path)) for path in (run_dir / "eval").rglob("*.jsonl"))
    one_arm = next(iter(arms))

    per_teacher_step = step_seconds(
        model_path, run_dir / "data" / "teacher_train.jsonl", cfg.teacher, cfg.teacher.global_batch_size, sample_steps
    )
    per_arm_step = step_seconds(
        model_path, run_dir / "arms" / one_arm / "train.jsonl", cfg.student, cfg.student.global_batch_size, sample_steps
    )
    engine = HFEngine(model_path, ServiceSettings(engine="hf", model=model_path))
    asyncio.run(engine.add_adapter("teacher", str(run_dir / "teacher" / "adapter")))
    per_sequence = 1 / generation_rate(engine, cfg, "teacher", sample_prompts)
    questions = read_jsonl(run_dir / "data" / "held_out.jsonl")
    per_question = 1 / scoring_rate(engine, questions, "teacher", cfg.evaluate.chunk, cfg.service.max_model_len)
    engine.shutdown()
    return {
        "data": {"work": "split the questions", "floor_s": timings.get("data", 0.0), "run_s": timings.get("data", 0.0)},
        "teacher": {
            "work": f"{teacher_steps} steps x {cfg.teacher.global_batch_size} rows at {per_teacher_step:.3f} s",
            "floor_s": teacher_steps * per_teacher_step,
            "run_s": timings["teacher"],
        },
        "numbers": {
            "work": f"{generated} sequences at {per_sequence * 1000:.1f} ms",
            "floor_s": generated * per_sequence,
            "run_s": timings["numbers"],
        },
        "arms": {
            "work": f"{sum(arms.values())} steps x {cfg.student.global_batch_size} rows at {per_arm_step:.3f} s",
            "floor_s": sum(arms.values()) * per_arm_step,
            "run_s": timings["arms"],
        },
        "evaluate": {
            "work": f"{scored} questions at {per_question * 1000:.2f} ms",
            "floor_s": scored * per_question,
            "run_s": timings["evaluate"],
        },
        "report": {
            "work": "tables and plots",
            "floor_s": timings.get("report", 0.0),
            "run_s": timings.get("report", 0.0),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a finished run directory of the default preset")
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps timed per training phase (the best is kept)"
    )
    parser.add_argument("--prompts", type=int, default=256, help="number prompts generated to time generation")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args()
    torch.manual_seed(0)
    transformers.logging.disable_progress_bar()
    table = floors(args.run_dir, args.steps, args.prompts)
    spans = Manifest(args.run_dir).phase_spans()
    start = spans.get("start", {}).get("seconds", 0.0)  # the driver's start before the first phase: no work
    table["start"] = {"work": "none (interpreter, imports, Ray, the plan)", "floor_s": 0.0, "run_s": start}
    print(f"{'phase':<9} {'floor s':>8} {'run s':>7} {'ratio':>6}  work")
    for phase, row in table.items():
        ratio = row["run_s"] / row["floor_s"] if row["floor_s"] else float("nan")
        print(f"{phase:<9} {row['floor_s']:8.1f} {row['run_s']:7.1f} {ratio:6.2f}  {row['work']}")
    floor, run = sum(r["floor_s"] for r in table.values()), sum(r["run_s"] for r in table.values())
    print(f"{'total':<9} {floor:8.1f} {run:7.1f} {run / floor:6.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"run_dir": str(args.run_dir), "phases": table, "floor_s": floor, "run_s": run}, indent=2)
        )


if __name__ == "__main__":
    main()
