"""Scoring four models (base + three adapters) on the same questions: the service vs lm-evaluation-harness.

    python bench/scoring_vs_lm_eval.py [--questions 3000] [--engine hf|vllm] [--scoring auto|engine] [--replicas 2]

The service's time includes starting Ray and the Serve application; the four
models are scored concurrently, in chunks spread over the replicas (the
pipeline's evaluation fan-out). lm-evaluation-harness (HF backend, batch 16)
runs once per model as a subprocess, its start-up included. Predictions must
be identical. The adapters have random weights (jobs.sources.tiny_model.random_lora_adapter):
any adapter that changes the model serves for a timing and parity check.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from bench_common import mc_questions, tiny_model
from lm_eval_reference import run_lm_eval

from jobs.sources.tiny_model import random_lora_adapter
from serve.settings import ServiceSettings

URL = "http://127.0.0.1:8000"
CHUNK = 250


def score_with_service(
    model: str, adapters: dict, questions: list[dict], settings: dict, replicas: int
) -> tuple[dict, float]:
    """Per-model predictions and wall seconds, from `ray.init` to the last answer."""
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from serve.launch import start_service

    start_service(ServiceSettings(model=model, **settings), adapters, replicas=replicas, num_cpus=2 / replicas)
    jobs = [(name, i) for name in [None, *adapters] for i in range(0, len(questions), CHUNK)]

    def score(job):
        name, i = job
        body = {"questions": questions[i : i + CHUNK], "adapter": name}
        response = requests.post(URL + "/score", json=body, timeout=600)
        response.raise_for_status()
        return [r["prediction"] for r in response.json()["results"]]

    with ThreadPoolExecutor(2 * replicas) as pool:
        answers = list(pool.map(score, jobs))
    seconds = time.perf_counter() - started
    ray.shutdown()
    predictions: dict = {}
    for (name, _), chunk in zip(jobs, answers):
        predictions.setdefault(name or "base", []).extend(chunk)
    return predictions, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=3000)
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="the service's generation engine (scoring is transformers on CPU either way)",
    )
    parser.add_argument(
        "--scoring", choices=["auto", "engine"], default="auto", help="engine: score on vLLM too (its CPU LoRA path)"
    )
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    model = tiny_model()
    questions = mc_questions(args.questions)
    work = Path(tempfile.mkdtemp(prefix="bench-lm-eval-"))
    adapters = {f"adapter{i}": str(random_lora_adapter(model, work / f"adapter{i}", seed=i)) for i in (1, 2, 3)}

    settings = {"engine": args.engine, "scoring": args.scoring}
    served, service_s = score_with_service(model, adapters, questions, settings, args.replicas)
    reference, lm_eval_s = {}, 0.0
    for name, path in [("base", None), *adapters.items()]:
        reference[name], seconds = run_lm_eval(model, path, questions, work / f"lm-eval-{name}", batch_size=16)
        lm_eval_s += seconds
    differing = {name: sum(a != b for a, b in zip(served[name], reference[name])) for name in reference}
    print(
        json.dumps(
            {
                "questions": len(questions),
                "models": len(reference),
                **settings,
                "replicas": args.replicas,
                "service_s": round(service_s, 1),
                "lm_eval_s": round(lm_eval_s, 1),
                "speedup": round(lm_eval_s / service_s, 2),
                "differing_predictions": differing,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
