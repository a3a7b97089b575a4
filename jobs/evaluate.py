"""The evaluation stage: every model scored on the held-out questions, in parallel, and the statistics.

Work is split by (model, chunk of questions) and sent concurrently to the
service, whose replicas share it (one per GPU on GPU clusters). Scoring is the
service's one-pass `/score`. Accuracy comes with a Wilson 95% interval; the
transfer measure (does the student pick up the teacher's answers?) is the
student's agreement with the teacher minus the control's, averaged over
replicate pairs, with a hierarchical bootstrap CI (replicates, then questions).
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


def hierarchical_bootstrap(values, resamples: int, seed: int) -> list[float]:
    """95% percentile interval of the mean of `values` [replicates x questions], resampling
    replicates and then questions, so the interval holds replicate-to-replicate spread as well
    as question sampling (with one replicate it is the usual bootstrap over questions)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    reps, n = values.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for b in range(resamples):  # one resample at a time: memory stays O(replicates x questions)
        rows = values[rng.integers(0, reps, reps)]
        means[b] = rows[:, rng.integers(0, n, n)].mean()
    low, high = np.percentile(means, [2.5, 97.5])
    return [float(low), float(high)]


def agreement(predictions: list[int], reference: list[int]) -> list[float]:
    """Per question: 1.0 where the two models pick the same choice."""
    return [float(p == r) for p, r in zip(predictions, reference)]


def transfer(teacher: list[int], students: list[list[int]], controls: list[list[int]], resamples: int, seed: int) -> dict:
    """Agreement with the teacher of each student replicate minus that of its control replicate,
    averaged over replicate pairs, with a hierarchical bootstrap 95% CI (pairs, then questions)."""
    import numpy as np

    s = np.array([agreement(p, teacher) for p in students])
    c = np.array([agreement(p, teacher) for p in controls])
    return {
        "value": float((s - c).mean()),
        "ci95": hierarchical_bootstrap(s - c, resamples, seed),
        "student_teacher_agreement": float(s.mean()),
        "control_teacher_agreement": float(c.mean()),
        "replicate_pairs": len(students),
    }
