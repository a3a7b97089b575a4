"""The evaluation stage: every model scored on both splits' questions, in parallel; accuracy.

Work is split by (model, chunk of questions) and sent concurrently to the
service, whose replicas share it (one per GPU on GPU clusters); a chunk whose
replica died is resent. Scoring is the service's one-pass `/score`. Accuracy
comes with a Wilson 95% interval; the transfer statistics are jobs/transfer_stats.py's.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jobs.progress import ProgressLine
from jobs.service_session import result_or_resend
from serve.schemas import Question, ScoreRequest


def score_models(handle, models: dict[str, str | None], questions: list[dict], chunk: int, in_flight: int) -> dict[str, list[dict]]:
    """Per model (name -> adapter, None = base), the questions with `prediction`, `logprobs` and
    `truncated_tokens` (prompt tokens cut from the left to fit the context, lm-evaluation-harness's rule) added."""
    body = [Question(question=q["question"], choices=q["choices"], answer=q["answer"], subject=q["subset"]) for q in questions]
    jobs = [(name, start) for name in models for start in range(0, len(questions), chunk)]
    total, started, done, lock, progress = len(questions) * len(models), time.time(), [0], threading.Lock(), ProgressLine()

    def score(job):
        name, start = job
        request = ScoreRequest(questions=body[start : start + chunk], adapter=models[name], truncate=True)  # a long question never fails the stage
        results = result_or_resend(handle.score, request, handle.score.remote(request), f"{name} questions {start}+").results
        with lock:
            done[0] += len(results)
            progress.print(f"[evaluate] {done[0]}/{total} scored, {done[0] / (time.time() - started):.0f} questions/s", final=done[0] == total)
        return results

    with ThreadPoolExecutor(in_flight) as pool:
        answers = list(pool.map(score, jobs))
    scored: dict[str, list[dict]] = {name: [] for name in models}
    for (name, start), results in zip(jobs, answers):
        for q, r in zip(questions[start : start + chunk], results):
            scored[name].append({**q, "prediction": r.prediction, "logprobs": r.logprobs, "truncated_tokens": r.truncated_tokens})
    return scored


def context_check(model_path: str, questions: list[dict], max_model_len: int) -> str:
    """One line on whether every question's prompt fits the scoring context, measured with the
    model's tokenizer before any model is loaded: prompts that do not fit are scored
    left-truncated (`truncated_tokens` in the eval rows), never failing the stage."""
    from transformers import AutoTokenizer

    from serve.mc_format import format_mc_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in questions]
    lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=True).input_ids]
    over = sum(n > max_model_len - 1 for n in lengths)  # one token of room for the answer letter
    line = f"longest question prompt {max(lengths)} tokens (service.max_model_len {max_model_len})"
    return line + (f": {over} of {len(lengths)} questions will be scored left-truncated, as lm-evaluation-harness does" if over else ": all fit")


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
