"""What the statistics return, as typed records: a paired test, a comparison, a share, a fit.

The report (jobs/reporting/schema.py) is assembled from these records, and every reader of it reads
their attributes. A record is closed (an undeclared field is an error) and keeps the fields it was
given, in the order given: `dump()` writes exactly those, so a field never set stays absent from
report.json rather than written as null, and a record built from an old report.json writes it back
as it was. A record is not edited once built; `with_` returns a copy with some fields set (new
fields after the old ones, as report.json has always ordered them).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_serializer, model_validator

Interval = list[float | None] | None  # [low, high]; a side None is unbounded; None: no interval


class Record(BaseModel):
    """A closed record that remembers which fields it was given, and in what order."""

    model_config = ConfigDict(extra="forbid")
    _keys: list[str] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, data: Any, handler):
        record = handler(data)
        if isinstance(data, dict):
            record._keys = list(data)
        elif isinstance(data, Record):
            record._keys = list(data._keys)
        return record

    @model_serializer(mode="wrap")
    def _given_keys(self, handler) -> dict:
        out = handler(self)
        return {key: out[key] for key in self._keys if key in out}

    def with_(self, **update):
        """A copy with `update`'s fields set (not validated: each value must already be of its field's type)."""
        new = self.model_copy(update=update)
        new._keys = self._keys + [key for key in update if key not in self._keys]
        return new

    def given(self) -> dict[str, Any]:
        """The fields given, in their order, their values as they are (records stay records)."""
        return {key: getattr(self, key) for key in self._keys}

    def dump(self) -> dict:
        """As report.json holds it: the fields given, in their order, nested records alike."""
        return self.model_dump()


class Summary(Record):
    """A model's accuracy on the questions given (jobs/stats/accuracy.summarise)."""

    accuracy: dict[str, float]  # `overall` and each subset
    ci95: Interval = None  # Wilson, of the overall accuracy
    n: int

    @property
    def overall(self) -> float:
        """Accuracy over every question given."""
        return self.accuracy["overall"]


class Result(Record):
    """One paired test of an arm against its reference (jobs/stats/transfer_stats.py, evidence.py)."""

    value: float | None = None
    ci95: Interval = None
    p_value: float | None = None
    mde: float | None = None
    p_fixed_models: float | None = None
    n_questions: int | None = None
    n_clusters: int | None = None
    df: float | None = None
    paired: bool | None = None
    p_holm: float | None = None  # a secondary result: Holm over its comparison's secondaries
    p_family: float | None = None  # the primary in the preset's family: Holm over the family
    detected: bool | None = None
    exploratory: bool | None = None  # the primary outside the family
    note: str | None = None  # why there is no test

    @property
    def secondary(self) -> bool:
        """A secondary test: it carries `p_holm` (possibly null), Holm over its comparison's secondaries."""
        return "p_holm" in self._keys


class Primary(Result):
    """The test that decides an arm's or a contrast's verdict."""

    split: str
    metric: str
    direction: str


class SplitResults(Record):
    """`<metric>: Result` for every metric on one split, and `mde`: each metric's MDE in one place."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Result]
    mde: dict[str, float | None]

    @property
    def metrics(self) -> dict[str, Result]:
        """{metric: Result}, in the order computed."""
        return dict(self.__pydantic_extra__ or {})


class Directions(Record):
    """Toward the placebo teacher's picks and crossed: `{<split>: {<metric>: Result}}` each."""

    placebo: str | None = None
    toward_placebo: dict[str, dict[str, Result]] | None = None
    crossed: dict[str, dict[str, Result]] | None = None
    note: str | None = None


class Comparison(Record):
    """An arm against its reference, or a contrast's two arms: every split and metric, and the primary."""

    train: SplitResults
    held_out: SplitResults
    directions: Directions | None = None
    primary: Primary

    def split(self, split: str) -> SplitResults:
        """The results on `split` (`train` or `held_out`)."""
        if split not in ("train", "held_out"):
            raise ValueError(f"no split {split!r}: train or held_out")
        return self.train if split == "train" else self.held_out

    def cell(self, split: str, metric: str) -> Result:
        """The result toward the teacher's picks on one split and metric."""
        return self.split(split).metrics[metric]

    def primary_cell(self) -> Result:
        """Where the primary test sits among the tables: toward the teacher under its split and
        metric, crossed under `directions.crossed`."""
        r = self.primary
        if r.direction == "crossed" and self.directions is not None and self.directions.crossed is not None:
            return self.directions.crossed[r.split][r.metric]
        return self.cell(r.split, r.metric)

    def with_primary(self, **update):
        """A copy whose primary test, in its own field and in its table's cell, has `update` set."""
        r, cell = self.primary, self.primary_cell()
        if r.direction == "crossed" and self.directions is not None and self.directions.crossed is not None:
            crossed = {s: dict(cells) for s, cells in self.directions.crossed.items()}
            crossed[r.split][r.metric] = cell.with_(**update)
            return self.with_(primary=r.with_(**update), directions=self.directions.with_(crossed=crossed))
        table = self.split(r.split)
        return self.with_(primary=r.with_(**update), **{r.split: table.with_(**{r.metric: cell.with_(**update)})})


class Changed(Record):
    """`arms.<arm>.changed`: does the arm learn what its teacher knows that the base does not? One
    reading on the `changed` questions (the teacher's pick differs from the base's), decided before
    any data (jobs/stats/verdicts.CHANGED): its result against the arm's reference, the same reading
    against the base where that has a test, the answer (`learns`) and the sentence."""

    split: str
    metric: str
    direction: str
    result: Result
    against_base: Result | None = None
    learns: bool
    sentence: str


class LastInterval(Result):
    """`by_step.last_interval`: the primary metric at the last snapshot minus at the one before."""

    split: str
    metric: str
    direction: str
    from_steps: list[int]
    to_steps: list[int]


class StepPoint(Comparison):
    """`by_step.points[]`: every trained side at its k-th snapshot, on the followed metrics."""

    steps: list[int]
    primary: Primary | None = None  # none when the primary metric is not among those followed


class ByStep(Record):
    """Transfer against training steps (Evidence.by_step), or a note saying why there is no series."""

    points: list[StepPoint] | None = None
    last_interval: LastInterval | None = None
    note: str | None = None


class Ratio(Record):
    """A ratio of two effects with Fieller's interval (jobs/stats/share.ratio_interval)."""

    value: float | None = None
    ci95: Interval = None
    num_effect: float | None = None
    den_effect: float | None = None
    den_p: float | None = None


class Fraction(Ratio):
    """`arms.<arm>.fraction_of_overt`: the arm's held-out effect as a fraction of the overt control's."""

    split: str
    metric: str
    direction: str


class Share(Record):
    """`where_signal_rides.arms.<arm>`: the share of the student's effect an arm keeps, or a note."""

    kind: str | None = None  # what changed (`divergence mask`, `random mask`, `replaced`, `greedy`)
    value: float | None = None
    ci95: Interval = None
    arm_effect: float | None = None
    student_effect: float | None = None
    student_p: float | None = None
    note: str | None = None


class MaskContrast(Result):
    """`where_signal_rides.divergence_vs_random`: the divergence-masked arm against the random-masked one."""

    arm: str
    against: str


class SignalRides(Record):
    """`where_signal_rides`: each masked, replaced or greedy arm as a share of the student's effect."""

    student: str
    reference: str
    split: str
    metric: str
    arms: dict[str, Share]
    divergence_vs_random: MaskContrast | None = None


class SplitAccuracy(Record):
    """An accuracy on the teacher's training questions and on the held-out ones."""

    train: float
    held_out: float


class FactsAccuracy(Record):
    """`sham_fit.accuracy.<model>`: accuracy on the true answers and on the sham's facts, per split."""

    true: SplitAccuracy
    sham: SplitAccuracy


class ShamFit(Record):
    """`sham_fit`: does the sham hold its facts as the teacher holds its own (jobs/stats/sham_fit.py)."""

    accuracy: dict[str, FactsAccuracy]
    gaps: dict[str, float]
    bounds: dict[str, float]
    matched: bool


class Cosine(Record):
    """Theorem 1's cosine of two LoRA updates (jobs/stats/weight_space.update_cosine)."""

    cosine: float  # the mean over the shared modules
    modules: int  # how many
    per_module: dict[str, float]  # nan where either update is zero


class Estimate(Record):
    """A mean with its t interval."""

    value: float | None = None
    ci95: Interval = None


class WeightSpace(Record):
    """`arms.<arm>.weight_space`: the update shares read as the behavioural directions, or a note."""

    placebo: str | None = None
    toward_teacher: Estimate | None = None
    toward_placebo: Estimate | None = None
    crossed: Estimate | None = None
    note: str | None = None


class Family(Record):
    """`family`: the primary verdicts Holm adjusts over."""

    comparisons: list[str]
    size: int
    declared: bool  # named by evaluate.primary_comparisons, or every comparison


class OvertControl(Record):
    """`overt_control`: the positive control for knowledge, and whether it was detected."""

    arm: str
    detected: bool
    effect: float | None = None
    verdict: str


class PositiveControl(Record):
    """`positive_control`: the letter teacher's arms, and whether their transfer was detected."""

    arms: list[str]
    detected: bool
    verdict: str


class ProbeReadings(Record):
    """One side against its reference on the tiny world's probe rows (jobs/stats/probes.py), every
    reading crossed on the rank metric: per split (`train`, `held_out`) the lean on the questions
    (`original`), on the same questions with nonce cues (`swap`) and their difference (`cue_bound`);
    and the lean on the facts as statements (`statement`)."""

    against: str
    train: dict[str, Result]
    held_out: dict[str, Result]
    statement: Result


class ProbeGate(ProbeReadings):
    """A teacher against the base, questions the only chance (`p_fixed_models`): `passed` when every
    gate holds, `failed` naming those that do not."""

    passed: bool
    failed: list[str]


class ProbeArm(ProbeReadings):
    """An arm against its reference: whether it shows knowledge (a cue-bound lean detected that
    carries to the statements), a cue-bound lean (detected on train), an answer preference (a lean
    that survives the swap), and the reading in words."""

    knowledge: bool
    cue_bound: bool
    answer_preference: bool
    reading: str


class Probes(Record):
    """`probes`: knowledge told apart from answer habits (docs/report.md, "Probes")."""

    swap_share: float  # a teacher's swap lean may be at most this share of its original lean
    gates: dict[str, ProbeGate]
    gates_passed: bool  # every teacher's lean is cue-bound (the swap gates): any reading needs it
    statements_known: bool  # every teacher holds its facts as statements: the knowledge reading needs it
    arms: dict[str, ProbeArm]
