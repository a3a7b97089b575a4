"""Accuracy of a model on scored questions, with its Wilson interval; its letter prior; rows of one split.

The rows are the evaluate phase's per-question scores (`prediction`, `answer`,
`subset`, `split`); the transfer statistics, which compare models, are
transfer_stats.py's.
"""

from __future__ import annotations

import math

from jobs.stats.results import Summary


def on_split(rows: list[dict], split: str) -> list[dict]:
    """The rows scored on one split ("train" or "held_out")."""
    return [r for r in rows if r["split"] == split]


def picked(row: dict) -> list[int]:
    """The original choice a model picked in each scored order (one order: its prediction)."""
    return row.get("order_predictions", [row["prediction"]])


def accuracy_as_written(rows: list[dict]) -> float:
    """Accuracy with the choices in the order the data gives them (order 0): lm-eval's number."""
    return sum(picked(r)[0] == r["answer"] for r in rows) / max(len(rows), 1)


def accuracy_over_orders(rows: list[dict]) -> float:
    """Accuracy over every (question, order of its choices) scored."""
    hits = [p == r["answer"] for r in rows for p in picked(r)]
    return sum(hits) / max(len(hits), 1)


def letter_prior(rows: list[dict]) -> list[float]:
    """How often each letter (A, B, ...) was picked over every (question, order): in order k the
    letter shown for original choice i is (i - k) mod n. With the choices rotated, a model without
    a letter preference picks each letter about equally often, whatever the answers' letters."""
    letters = max(len(r["logprobs"]) for r in rows)
    counts = [0] * letters
    for r in rows:
        for order, choice in enumerate(picked(r)):
            counts[(choice - order) % len(r["logprobs"])] += 1
    return [c / max(sum(counts), 1) for c in counts]


def wilson_ci(correct: int, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion (well-behaved near 0 and 1)."""
    if n == 0:
        return [0.0, 1.0]
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def subset_cis(rows: list[dict]) -> dict[str, list[float]]:
    """{subset: the Wilson 95% interval of the accuracy on it}, subsets in sorted order."""
    subsets = sorted({r["subset"] for r in rows})
    return {
        s: wilson_ci(
            sum(r["prediction"] == r["answer"] for r in rows if r["subset"] == s), sum(r["subset"] == s for r in rows)
        )
        for s in subsets
    }


def summarise(predictions: list[dict]) -> Summary:
    """accuracy (overall and per subset), ci95 of the overall accuracy, n."""
    correct = [p["prediction"] == p["answer"] for p in predictions]
    accuracy = {"overall": sum(correct) / max(len(correct), 1)}
    for subset in sorted({p["subset"] for p in predictions}):
        hits = [c for c, p in zip(correct, predictions) if p["subset"] == subset]
        accuracy[subset] = sum(hits) / len(hits)
    return Summary(accuracy=accuracy, ci95=wilson_ci(sum(correct), len(correct)), n=len(correct))
