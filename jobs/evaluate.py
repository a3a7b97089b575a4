"""Score models on held-out WMDP questions and summarise accuracy with 95% intervals.

Scoring is the one-pass multiple-choice scoring of `serve.hf_scoring` (the
transformers engine); the Serve-backed fan-out across replicas replaces the
in-process call once the Serve deployment exists.
"""

from __future__ import annotations

import math

from serve.hf_scoring import mc_logprobs
from serve.mc_format import format_mc_prompt


def score_questions(model_path: str, adapter: str | None, questions: list[dict]) -> list[dict]:
    """Per-question predictions: the input fields plus `prediction` and `logprobs`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    prompts = [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in questions]
    logprobs = mc_logprobs(model, tokenizer, prompts, [len(q["choices"]) for q in questions])
    return [
        {**q, "prediction": max(range(len(lp)), key=lp.__getitem__), "logprobs": lp}
        for q, lp in zip(questions, logprobs)
    ]


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
