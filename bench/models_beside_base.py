"""Serving fully fine-tuned models: one Serve application each, or beside their base in one.

    .venv/bin/python bench/models_beside_base.py [--models 3] [--repeats 2]

The evaluate phase scores each fully fine-tuned arm model (`train.method: full`). It used to start
one Serve application per model; on the transformers engine they are now held beside the base
(user_config `models`, docs/api.md), in the base's application. This times both ways on a local
Ray cluster of 2 CPUs, with two one-CPU replicas an application as the tiny presets' evaluate phase
has them, the applications one after the other: from `start_service` to the
application's first health answer, then the same cloze questions scored through every model, then
teardown. The models are copies of the tiny base with their weights perturbed (saved with
`save_pretrained`), so each scores differently; the scores of both ways are checked equal.
Results: BENCHMARKS.md, "The pipeline's overhead".
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.files import tiny_model_link
from jobs.sources.wmdp import synthetic_questions
from serve.launch import start_service, stop_service
from serve.schemas import Question, ScoreRequest
from serve.settings import ServiceSettings


def perturbed_copies(base: str, root: Path, count: int) -> dict[str, str]:
    """`count` copies of the base with noise on every weight (seed i), as model folders."""
    folders = {}
    for i in range(count):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        generator = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.05)
        folders[f"full-{i}"] = str(root / f"full-{i}")
        model.save_pretrained(folders[f"full-{i}"])
        AutoTokenizer.from_pretrained(base).save_pretrained(folders[f"full-{i}"])
    return folders


def served(
    model: str, names: dict[str, str | None], questions: list[Question], models: dict | None = None
) -> tuple[float, float, float, dict]:
    """(start-up s, scoring s, teardown s, {name: log-probabilities}) of one application."""
    marks = [time.perf_counter()]
    handle = start_service(
        ServiceSettings(engine="hf", model=model, max_model_len=256),
        models=models,
        name="bench-beside",
        replicas=2,
        num_cpus=1,
    )
    handle.health.remote().result()
    marks.append(time.perf_counter())
    scores = {}
    for name, target in names.items():
        request = ScoreRequest(questions=questions, adapter=target, format="cloze")
        scores[name] = [r.logprobs for r in handle.score.remote(request).result().results]
    marks.append(time.perf_counter())
    stop_service("bench-beside")
    marks.append(time.perf_counter())
    return marks[1] - marks[0], marks[2] - marks[1], marks[3] - marks[2], scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=3, help="fully fine-tuned models to serve")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    base = str(tiny_model_link())
    questions = [
        Question(question=q["question"], choices=q["choices"], answer=q["answer"], subject=q["subset"])
        for q in synthetic_questions(32)
    ]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        folders = perturbed_copies(base, Path(tmp), args.models)
        print("| way | repeat | start-up s | scoring s | teardown s | total s |\n|---|---|---|---|---|---|")
        for repeat in range(args.repeats):
            apart = [served(base, {"base": None}, questions)] + [
                served(folder, {name: None}, questions) for name, folder in folders.items()
            ]
            beside = served(base, {"base": None} | {name: name for name in folders}, questions, models=folders)
            apart_scores = {k: v for run in apart for k, v in run[3].items()}
            assert apart_scores == beside[3], "a model scored beside the base differs from the same model served alone"
            for way, runs in (("one application per model", apart), ("models beside the base", [beside])):
                parts = [sum(run[i] for run in runs) for i in range(3)]
                print(
                    f"| {way} ({len(runs)} app(s)) | {repeat + 1} | {parts[0]:.1f} | {parts[1]:.1f} | {parts[2]:.1f} | {sum(parts):.1f} |"
                )
    ray.shutdown()


if __name__ == "__main__":
    main()
