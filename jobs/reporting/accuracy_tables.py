"""The report's accuracy tables, read from per-question scores alone (jobs/phases/report.py reads
the scores and calls these): a fixed model's row of `models` and an arm's mean over its replicates
(`Accuracy`), accuracy per split, and the sections on how the prompts were read:
`truncated_questions`, `letter_prior` and `accuracy_by_order` (the order of the choices)."""

from __future__ import annotations

import numpy as np

from jobs.experiment.cast import Cast
from jobs.experiment.config import ExperimentConfig
from jobs.experiment.stages import SPLIT_FILES
from jobs.reporting.schema import Accuracy, AccuracyByOrder, LetterPrior
from jobs.stats.accuracy import accuracy_as_written, accuracy_over_orders, letter_prior, on_split, summarise, wilson_ci
from jobs.stats.evidence import SPLITS
from jobs.stats.transfer_stats import cluster_ids, effect


def by_split(rows: list[dict]) -> dict:
    """{split: overall accuracy} of one model on each split."""
    return {split: summarise(on_split(rows, split)).overall for split in SPLITS}


def _subset_cis(rows: list[dict]) -> dict:
    """Wilson 95% interval of a fixed model's accuracy on each subset."""
    subsets = sorted({r["subset"] for r in rows})
    return {
        s: wilson_ci(
            sum(r["prediction"] == r["answer"] for r in rows if r["subset"] == s), sum(r["subset"] == s for r in rows)
        )
        for s in subsets
    }


def fixed_model(rows: list[dict], every_split: list[dict]) -> Accuracy:
    """A fixed model's row of `models`: held-out accuracy with Wilson intervals, and per split."""
    return Accuracy.model_validate(
        {**summarise(rows).given(), "ci95_by_subset": _subset_cis(rows), "accuracy_by_split": by_split(every_split)}
    )


def mean_model(rows_per_replicate: list[list[dict]]) -> Accuracy:
    """Accuracy of an arm: the mean over its replicates, its CI for other seeds and questions
    (jobs/stats/transfer_stats.py; none with one replicate), overall and per subset."""
    summaries = [summarise(rows) for rows in rows_per_replicate]
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


def by_order(rows_per_model: list[list[dict]]) -> dict:
    """{split: {as_written, over_orders, n}} for every split scored (known only where the data has
    it), each the mean over the models given (an arm's replicates, or one model)."""
    out = {}
    for split in SPLIT_FILES:
        per = [on_split(rows, split) for rows in rows_per_model]
        if per[0]:
            out[split] = {
                "as_written": sum(map(accuracy_as_written, per)) / len(per),
                "over_orders": sum(map(accuracy_over_orders, per)) / len(per),
                "n": len(per[0]),
            }
    return out


def prompt_sections(cfg: ExperimentConfig, cast: Cast, both: dict, scores: dict) -> dict:
    """report.json's `truncated_questions`, `letter_prior` and `accuracy_by_order`: how the prompts
    were read rather than what the models learnt, for every model as trained (`cast.final`: no
    earlier snapshots). `both`: every model's rows of every split, `scores` its held-out rows."""
    # Questions whose prompt was cut from the left to fit the context (the same for every model).
    truncated = {
        split: sum(r.get("truncated_tokens", 0) > 0 for r in both["base"] if r["split"] == split) for split in SPLITS
    }
    prior = LetterPrior(  # held out: the rows every transfer metric reads
        orders=cfg.evaluate.orders(),
        models={
            name: {"prior": letter_prior(scores[name]), "accuracy_over_orders": accuracy_over_orders(scores[name])}
            for name in cast.final
        },
    )
    arms = {arm: by_order([both[m.name] for m in cast.arms[arm]]) for arm in cfg.arms}
    orders = AccuracyByOrder(
        orders=cfg.evaluate.orders(), models={name: by_order([both[name]]) for name in cast.fixed} | arms
    )
    return {"truncated_questions": truncated, "letter_prior": prior, "accuracy_by_order": orders}
