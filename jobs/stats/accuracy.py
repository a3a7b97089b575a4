"""Accuracy of a model on scored questions, with its Wilson interval; rows of one split.

The rows are the evaluate phase's per-question scores (`prediction`, `answer`,
`subset`, `split`); the transfer statistics, which compare models, are
transfer_stats.py's.
"""

from __future__ import annotations

import math


def on_split(rows: list[dict], split: str) -> list[dict]:
    """The rows scored on one split ("train" or "held_out")."""
    return [r for r in rows if r["split"] == split]


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
