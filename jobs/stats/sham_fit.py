"""Does the matched sham hold its facts as the teacher holds its own?

The sham teacher is the reference for knowledge only if it differs from the
teacher in which facts it holds and in nothing else (docs/report.md, "The
matched sham"). On data whose questions carry the sham's fact (`sham`, the tiny
world's sigma(cue)), every model is scored against both: its accuracy on the
true answers and on the sham's facts, per split. The sham is *matched* when its
accuracy on its facts comes within FIT_BOUNDS of the teacher's on the true ones
(train and held out) and, on the true answers, it is no higher than the base.
"""

from __future__ import annotations

from jobs.stats.accuracy import on_split
from jobs.stats.results import FactsAccuracy, ShamFit

FIT_BOUNDS = {"train": 0.05, "held_out": 0.10}  # |sham on its facts - teacher on the true ones| at most this


def accuracy_against(rows: list[dict], key: str) -> float:
    """Share of rows whose prediction is the choice `rows[i][key]` (`answer` or `sham`)."""
    return sum(r["prediction"] == r[key] for r in rows) / max(len(rows), 1)


def facts_accuracy(rows_per_replicate: list[list[dict]]) -> FactsAccuracy:
    """{true: {split: accuracy}, sham: {split: accuracy}}, each the mean over the replicates given."""
    out: dict = {"true": {}, "sham": {}}
    for split in FIT_BOUNDS:
        per = [on_split(rows, split) for rows in rows_per_replicate]
        out["true"][split] = sum(accuracy_against(r, "answer") for r in per) / len(per)
        out["sham"][split] = sum(accuracy_against(r, "sham") for r in per) / len(per)
    return FactsAccuracy.model_validate(out)


def sham_fit(scores: dict[str, list[list[dict]]], sham: str = "sham_teacher") -> ShamFit | None:
    """{accuracy: {model: facts_accuracy}, matched, bounds, gaps} for the models given (name -> its
    replicates' scored rows); None when the questions carry no sham fact or no sham was scored."""
    if sham not in scores or not all("sham" in r for r in on_split(scores["base"][0], "held_out")):
        return None
    accuracy = {name: facts_accuracy(rows) for name, rows in scores.items()}
    teacher, fitted, base = accuracy["teacher"], accuracy[sham], accuracy["base"]
    # FIT_BOUNDS' splits
    gaps = {"train": fitted.sham.train - teacher.true.train, "held_out": fitted.sham.held_out - teacher.true.held_out}
    no_higher = fitted.true.train <= base.true.train and fitted.true.held_out <= base.true.held_out
    matched = no_higher and all(abs(gaps[s]) <= FIT_BOUNDS[s] for s in FIT_BOUNDS)
    return ShamFit(accuracy=accuracy, gaps=gaps, bounds=FIT_BOUNDS, matched=matched)
