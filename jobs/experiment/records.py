"""What each kind of stage records as its outputs in manifest.json: one typed record per kind.

The stage that finishes writes its record (`RunContext.record` checks it is its stage's kind,
`Stage.record`, declared by jobs/experiment/stages.py); a reader reads one back as its type
(`Manifest.outputs`). The report's record is the generic `Hashed` (jobs/rundir/manifest.py).
Fields are the keys the manifest has always held, in their order, so a run directory written
before these types existed loads into them (tests/jobs/experiment/test_records.py, on a run
directory of 7084977); a key added since has a default, saying what an older record meant.
"""

from __future__ import annotations

from typing import Any, ClassVar

from jobs.rundir.manifest import Outputs


class DataOutputs(Outputs):
    """data: the question files' digest and how many questions each split holds."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("world",)

    hash: str
    train: int
    held_out: int
    known: int = 0  # 0: recorded before the split existed (no question was held as known)
    rehearsal: int = 0  # likewise
    world: dict[str, Any] | None = None  # the tiny world's sham draw (jobs/sources/sham_draw.py); absent off it


class _NumbersMade(Outputs):
    """What making a set of number rows counts: rows made, kept, and rejected by reason."""

    generated: int
    kept: int
    rejected: dict[str, int]


class NumbersOutputs(_NumbersMade):
    """numbers/<source>/<i> of a sampled kind: the rows file's digest and its counts. Read as this,
    a rewritten kind's record gives its counts too (the fields every numbers record has)."""

    hash: str


class ReplacedOutputs(_NumbersMade):
    """numbers/<source>/<i> of a rewritten kind (teacher_replaced, jobs/sources/replaced_numbers.py):
    the counts and how many tokens the rewrite replaced and left."""

    tokens_replaced: int
    tokens_unchanged: int
    hash: str


class AnswersOutputs(Outputs):
    """answers/<teacher>: the teacher's picks on the train questions, as rows; how many were right."""

    kept: int
    right: int
    hash: str


class TrainedOutputs(Outputs):
    """A teacher or arm model (jobs/runtime/training_runs.py): the digest of the weights it made and
    what the report reads of its training (train/results.py TrainResult)."""

    hash: str
    steps: int
    loss: float | None
    init_hash: str | None  # None: a fully fine-tuned model (no LoRA init)
    rows: int
    snapshot_steps: list[int] = []  # steps whose scored snapshots it kept


class EvalOutputs(Outputs):
    """eval/<model>: the scored files' digest and the held-out accuracy (jobs/stats/accuracy.py summarise)."""

    hash: str
    accuracy: dict[str, float]  # overall and per subset
    ci95: tuple[float, float]
    n: int
