"""The evaluation stage: every model scored on both splits' questions, in parallel; accuracy.

Work is split by (model, chunk of questions) and sent concurrently to the
service, whose replicas share it (one per GPU on GPU clusters). Scoring is the
service's one-pass `/score`. Accuracy comes with a Wilson 95% interval; the
transfer statistics are jobs/transfer_stats.py's.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from serve.schemas import Question, ScoreRequest


def score_models(handle, models: dict[str, str | None], questions: list[dict], chunk: int, in_flight: int) -> dict[str, list[dict]]:
    """Per model (name -> adapter, None = base), the questions with `prediction` and `logprobs` added."""
    body = [Question(question=q["question"], choices=q["choices"], answer=q["answer"], subject=q["subset"]) for q in questions]
    jobs = [(name, start) for name in models for start in range(0, len(questions), chunk)]
    total, started, done, lock = len(questions) * len(models), time.time(), [0], threading.Lock()

    def score(job):
        name, start = job
        results = handle.score.remote(ScoreRequest(questions=body[start : start + chunk], adapter=models[name])).result().results
        with lock:
            done[0] += len(results)
            print(f"[evaluate] {done[0]}/{total} scored, {done[0] / (time.time() - started):.0f} questions/s", flush=True)
        return results

    with ThreadPoolExecutor(in_flight) as pool:
        answers = list(pool.map(score, jobs))
    scored: dict[str, list[dict]] = {name: [] for name in models}
    for (name, start), results in zip(jobs, answers):
        for q, r in zip(questions[start : start + chunk], results):
            scored[name].append({**q, "prediction": r.prediction, "logprobs": r.logprobs})
    return scored


def wilson_ci(correct: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion (well-behaved near 0 and 1)."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def summarise(predictions: list[dict]) -> dict:
    """accuracy (overall and per subset), ci95 of the overall accuracy, n."""
    correct = [p["prediction"] == p["answer"] for p in predictions]
    accuracy = {"overall": sum(correct) / max(len(correct), 1)}
    for subset in sorted({p["subset"] for p in predictions}):
        hits = [c for c, p in zip(correct, predictions) if p["subset"] == subset]
        accuracy[subset] = sum(hits) / len(hits)
    return {"accuracy": accuracy, "ci95": wilson_ci(sum(correct), len(correct)), "n": len(correct)}


def agreement(predictions: list[int], reference: list[int]) -> list[float]:
    """Per question: 1.0 where the two models pick the same choice."""
    return [float(p == r) for p, r in zip(predictions, reference)]
