"""A one-minute guard against silent slowdowns of the paths the pipeline runs.

    make bench-quick            # or: python bench/quick.py [--repeats 5]

Each path is timed beside a reference that does the same work without the
project's code (plain transformers and torch), in the same process, the two
interleaved, the best of `--repeats` (5). A path's ratio (its seconds over its
reference's) does not move with the machine's speed or load the way seconds do,
so a change that slows a path 2x doubles its ratio. The last column compares
it with the ratio recorded in BENCHMARKS.md on the final code of the last
change that touched these paths (RECORDED below), and marks any path over 1.5x.

| path (the project's code) | reference |
|---|---|
| seeded generation: HFEngine.generate, 64 number prompts x 48 tokens, seed (numbers stage) | transformers `generate`, the same prompts as one unseeded batch |
| scoring: HFEngine.score, 512 WMDP questions (evaluate stage) | one forward of the same prompts, batches of 64 |
| cloze scoring: HFEngine.score_continuations, 512 tiny-world questions, one-token choices (the tiny presets' evaluate stage) | as scoring, over their cloze prompts |
| training step, sft: pack_batch + forward_loss + backward + clip + AdamW, 32 rows (arms stage) | the same rows padded, `model(labels=...)`, backward, AdamW |
| training step, logit_kl: the same, the KL to the teacher's stored targets (evidence preset) | as sft |

Deterministic inputs (fixed prompts, questions, rows and seeds), the tiny
preset's model, float32 on CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
import transformers
from bench_common import mc_questions, number_rows, tiny_model

from jobs.experiment.config import NumbersConfig
from jobs.phases.numbers import number_prompts
from jobs.sources.tiny_model import random_lora_adapter
from jobs.sources.wmdp import synthetic_questions
from serve.cloze import cloze_parts
from serve.engine import Sampling
from serve.hf_engine import HFEngine
from serve.mc_format import format_cloze_prompt, format_mc_prompt
from serve.settings import ServiceSettings
from train.config import TrainConfig
from train.data import TEACHER_COLUMN, Tokenize, pack_batch
from train.distill import number_token_ids, row_targets
from train.model import attach_lora, load_base
from train.step import forward_loss
from train.teacher_pass import TeacherPass, load_teacher

# path -> its ratio to its reference on the final code (BENCHMARKS.md, "Quick guard").
RECORDED = {
    "seeded generation": 0.91,
    "scoring": 0.88,
    "cloze scoring": 0.79,
    "training step, sft": 0.98,
    "training step, logit_kl": 1.04,
}
FLAG = 1.5


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare(path, reference, repeats: int) -> tuple[float, float]:
    """The best seconds of `path` and of `reference`, run alternately after one warm-up each (the
    best of several is what the machine can do; a slower run measured other work beside it)."""
    path(), reference()
    times = [(timed(path), timed(reference)) for _ in range(repeats)]
    return min(t for t, _ in times), min(r for _, r in times)


def generation(engine: HFEngine) -> tuple:
    prompts = number_prompts(engine.tokenizer, NumbersConfig(prompts=64, seed=0))
    sampling = Sampling(max_tokens=48, temperature=1.0, seed=0)
    enc = engine.tokenizer(prompts, return_tensors="pt", padding=True)
    pad, eos = engine.tokenizer.pad_token_id, engine.tokenizer.eos_token_id

    def reference():
        with torch.inference_mode():
            engine.model.generate(**enc, max_new_tokens=48, do_sample=True, top_k=0, pad_token_id=pad, eos_token_id=eos)

    return lambda: asyncio.run(engine.generate(prompts, sampling, None)), reference


def plain_forwards(engine: HFEngine, prompts: list[str]):
    """The scoring paths' reference: one forward of the prompts in batches of 64, the last position's logits kept."""

    def reference():
        with torch.inference_mode():
            for start in range(0, len(prompts), 64):
                engine.model(
                    **engine.tokenizer(prompts[start : start + 64], return_tensors="pt", padding=True), logits_to_keep=1
                )

    return reference


def scoring(engine: HFEngine) -> tuple:
    questions = mc_questions(512)
    prompts = [format_mc_prompt(q["question"], q["choices"], q["subject"]) for q in questions]
    n_choices = [len(q["choices"]) for q in questions]
    return lambda: asyncio.run(engine.score(prompts, n_choices, None)), plain_forwards(engine, prompts)


def cloze_scoring(engine: HFEngine) -> tuple:
    questions = synthetic_questions()[:512]
    prompts = [format_cloze_prompt(q["question"], q["subset"]) for q in questions]
    ids, continuations, _ = cloze_parts(engine.counting_tokenizer, prompts, [q["choices"] for q in questions], 0, False)
    return lambda: asyncio.run(engine.score_continuations(ids, continuations, None)), plain_forwards(engine, prompts)


def training(model_path: str, teacher: Path | None) -> tuple:
    """One optimizer step over 32 number rows as the trainer takes it, and the plain-transformers step."""
    cfg = TrainConfig(max_length=128)
    model = attach_lora(load_base(model_path, cfg, torch.device("cpu")), cfg)
    tokenize = Tokenize(model_path, cfg.max_length, cfg.too_long)
    rows = number_rows(32, seed=3)
    tokens = tokenize(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    ).to_pydict()
    pad = tokenize.tok.pad_token_id if tokenize.tok.pad_token_id is not None else tokenize.tok.eos_token_id
    number_ids = None
    if teacher is not None:  # the targets the pipeline computes before training (train/distill.py)
        number_ids = torch.tensor(number_token_ids(tokenize.tok))
        spec = TeacherPass(model_path, str(teacher), cfg, tuple(number_ids.tolist()))
        rows = list(zip(tokens["input_ids"], tokens["labels"]))
        tokens[TEACHER_COLUMN] = row_targets(load_teacher(spec, torch.device("cpu")), rows, number_ids, pad)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    width = max(map(len, tokens["input_ids"]))
    padded = {
        "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids in tokens["input_ids"]]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in tokens["input_ids"]]),
        "labels": torch.tensor([labels + [-100] * (width - len(labels)) for labels in tokens["labels"]]),
    }

    def step(loss_of):
        loss_of().backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def path():
        step(lambda: forward_loss(model, pack_batch(tokens, cfg.max_length, pad), number_ids))

    return path, lambda: step(lambda: model(**padded).loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    transformers.logging.disable_progress_bar()
    started = time.perf_counter()
    model_path = tiny_model()
    engine = HFEngine(model_path, ServiceSettings(engine="hf", model=model_path))
    with tempfile.TemporaryDirectory() as tmp:
        teacher = random_lora_adapter(model_path, Path(tmp) / "teacher", seed=1)
        paths = {
            "seeded generation": generation(engine),
            "scoring": scoring(engine),
            "cloze scoring": cloze_scoring(engine),
            "training step, sft": training(model_path, None),
            "training step, logit_kl": training(model_path, teacher),
        }
        print(f"{'path':<25} {'path s':>8} {'ref s':>8} {'ratio':>6} {'recorded':>9}")
        for name, (path, reference) in paths.items():
            seconds, ref = compare(path, reference, args.repeats)
            ratio = seconds / ref
            moved = ratio / RECORDED[name]
            mark = f"  <- {moved:.1f}x the recorded ratio" if moved > FLAG else ""
            print(f"{name:<25} {seconds:8.3f} {ref:8.3f} {ratio:6.2f} {RECORDED[name]:9.2f}{mark}", flush=True)
    engine.shutdown()
    print(f"[bench-quick] {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
