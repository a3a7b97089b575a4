"""The report's accuracy tables, read from per-question scores alone (jobs/phases/report.py reads
the scores and calls these). Each model as trained is read once (`read_accuracy`: a
`ModelAccuracy`), and every table takes those readings: a fixed model's row of `models`, an arm's
mean over its replicates (`Accuracy`) and each replicate's own figures, and the sections on how the
prompts were read: `truncated_questions`, `letter_prior` and `accuracy_by_order` (the order of the
choices)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from jobs.experiment.cast import Cast
from jobs.experiment.config import ExperimentConfig
from jobs.experiment.stages import SPLIT_FILES
from jobs.reporting.schema import Accuracy, AccuracyByOrder, LetterPrior
from jobs.stats.accuracy import (
    accuracy_as_written,
    accuracy_over_orders,
    letter_prior,
    on_split,
    subset_cis,
    summarise,
)
from jobs.stats.evidence import SPLITS
from jobs.stats.results import Summary
from jobs.stats.transfer_stats import cluster_ids, effect


class OrderReading(NamedTuple):
    """One model's accuracy on one split: its choices as written, over the orders scored, of how many questions."""

    as_written: float
    over_orders: float
    n: int


@dataclass(frozen=True)
class ModelAccuracy:
    """One model's accuracy, read once from its rows of every split (`read_accuracy`)."""

    held_out: Summary  # held out, overall and per subset, with the overall Wilson interval
    ci95_by_subset: dict  # held out: each subset's Wilson interval
    by_split: dict[str, float]  # overall accuracy on each split of SPLITS
    letter_prior: list[float]  # held out, over the orders scored (jobs/stats/accuracy.letter_prior)
    over_orders: float  # held out, over every (question, order) scored
    by_order: dict[str, OrderReading]  # every split scored (SPLIT_FILES); n 0 where it has no rows


def read_accuracy(rows: list[dict]) -> ModelAccuracy:
    """A model's `ModelAccuracy` from its rows of every split."""
    per_split = {split: on_split(rows, split) for split in SPLIT_FILES}
    held = per_split["held_out"]
    return ModelAccuracy(
        held_out=summarise(held),
        ci95_by_subset=subset_cis(held),
        by_split={split: summarise(per_split[split]).overall for split in SPLITS},
        letter_prior=letter_prior(held),
        over_orders=accuracy_over_orders(held),
        by_order={
            split: OrderReading(accuracy_as_written(r), accuracy_over_orders(r), len(r))
            for split, r in per_split.items()
        },
    )


def fixed_model(reading: ModelAccuracy) -> Accuracy:
    """A fixed model's row of `models`: held-out accuracy with Wilson intervals, and per split."""
    return Accuracy.model_validate(
        {**reading.held_out.given(), "ci95_by_subset": reading.ci95_by_subset, "accuracy_by_split": reading.by_split}
    )


def mean_model(readings: list[ModelAccuracy], rows_per_replicate: list[list[dict]]) -> Accuracy:
    """Accuracy of an arm: the mean over its replicates (their readings, and their held-out rows),
    its CI for other seeds and questions (jobs/stats/transfer_stats.py; none with one replicate),
    overall and per subset."""
    summaries = [r.held_out for r in readings]
    keys = summaries[0].accuracy
    correct = np.array([[float(r["prediction"] == r["answer"]) for r in rows] for rows in rows_per_replicate])
    subsets = np.array([r["subset"] for r in rows_per_replicate[0]])

    def ci95(values):
        return effect(
            values, np.zeros((1, values.shape[1])), cluster_ids(rows_per_replicate[0]), binary=True, b_fixed=True
        ).ci95

    return Accuracy(
        accuracy={k: sum(s.accuracy[k] for s in summaries) / len(summaries) for k in keys},
        ci95=ci95(correct),
        ci95_by_subset={k: ci95(np.where(subsets == k, correct, np.nan)) for k in keys if k != "overall"},
        n=summaries[0].n,
        replicates=len(summaries),
    )


def by_order(readings: list[ModelAccuracy]) -> dict:
    """{split: {as_written, over_orders, n}} for every split scored (known only where the data has
    it), each the mean over the models given (an arm's replicates, or one model)."""
    out = {}
    for split in SPLIT_FILES:
        per = [r.by_order[split] for r in readings]
        if per[0].n:
            out[split] = {
                "as_written": sum(p.as_written for p in per) / len(per),
                "over_orders": sum(p.over_orders for p in per) / len(per),
                "n": per[0].n,
            }
    return out


def prompt_sections(cfg: ExperimentConfig, cast: Cast, readings: dict[str, ModelAccuracy], base: list[dict]) -> dict:
    """report.json's `truncated_questions`, `letter_prior` and `accuracy_by_order`: how the prompts
    were read rather than what the models learnt, for every model as trained (`cast.final`: no
    earlier snapshots; `readings` each one's). `base`: the base model's rows of every split."""
    # Questions whose prompt was cut from the left to fit the context (the same for every model).
    truncated = {split: sum(r.get("truncated_tokens", 0) > 0 for r in base if r["split"] == split) for split in SPLITS}
    prior = LetterPrior(  # held out: the rows every transfer metric reads
        orders=cfg.evaluate.orders(),
        models={
            name: {"prior": readings[name].letter_prior, "accuracy_over_orders": readings[name].over_orders}
            for name in cast.final
        },
    )
    arms = {arm: by_order([readings[m.name] for m in cast.arms[arm]]) for arm in cfg.arms}
    orders = AccuracyByOrder(
        orders=cfg.evaluate.orders(), models={name: by_order([readings[name]]) for name in cast.fixed} | arms
    )
    return {"truncated_questions": truncated, "letter_prior": prior, "accuracy_by_order": orders}
