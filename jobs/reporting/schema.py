"""report.json as typed models: the report phase builds a `Report`, and every reader reads its attributes.

The report is assembled from what the statistics return (jobs/stats/results.py: a paired test, a
comparison, a share, a fit) and the models below; a field misspelled, missing or of the wrong type
is an error naming its path when the report is built or loaded, not a report that a reader
(report.md, the plots, MLflow, bench/verdict_tables.py) finds wrong later. `Report.dump()` is
report.json: every record writes the fields it was given, in their order (jobs/stats/results.Record),
so the file keeps its format and a report kept from an earlier version (results/) loads and writes
back as it was. What each field means is docs/report.md's prose; its section "Schema" is generated
from these models (`python -m jobs.reporting.schema --write docs/report.md`) and a test keeps the
two equal.

The resolved config, the seeds and the tiny world's draw stay mappings (they mirror the preset
and jobs/sources); every other section is closed: an unknown field is an error.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from jobs.stats.results import (
    ByStep,
    Changed,
    Comparison,
    Family,
    Fraction,
    Interval,
    OvertControl,
    PositiveControl,
    Probes,
    Record,
    ShamFit,
    SignalRides,
    Summary,
    WeightSpace,
)


class Accuracy(Summary):
    """A model's accuracy: a fixed model's, or an arm's mean over its replicates."""

    ci95_by_subset: dict[str, Interval] | None = None
    accuracy_by_split: dict[str, float] | None = None
    replicates: int | None = None  # an arm: replicates the mean is over
    teacher_agreement: float | None = None  # an arm's mean


class Replicate(Summary):
    """One trained model of an arm."""

    model: str
    accuracy_by_split: dict[str, float] | None = None
    teacher_agreement: float | None = None
    lora_seed: int | None = None
    init_hash: str | None = None
    same_init_as_teacher: bool
    steps: int
    final_loss: float | None = None
    rows: int | None = None
    update_cosine: float | None = None
    update_share: dict[str, float | None] | None = None


class Spread(Record):
    """`arms.<arm>.update_cosine`: mean and sd over the replicates."""

    mean: float | None = None
    sd: float | None = None


class MeasuredArm(Record):
    """An arm as measured, before its verdict is read: as declared, its replicates, and its
    comparison with what it is measured against."""

    numbers: str
    loss: str
    lora_seed: int | str | None = None
    teacher: str
    replicates: list[Replicate]
    base: str
    lora_init: str
    method: str
    mean: Accuracy
    update_cosine: Spread | None = None
    against: str
    reference: str
    transfer: Comparison | None = None
    against_base: Comparison | None = None  # the arm against its own base, where its reference is a trained arm
    weight_space: WeightSpace | None = None
    by_step: ByStep | None = None


class Arm(MeasuredArm):
    """An arm: as declared, its replicates, its comparison with what it is measured against, and its verdict."""

    fraction_of_overt: Fraction | None = None
    verdict: str
    changed: Changed | None = None


class Contrast(Comparison):
    """A declared contrast of two arms (`contrasts.<name>`)."""

    arm: str
    against: str
    by_step: ByStep | None = None
    verdict: str | None = None


class Entropy(Record):
    """`calibration.<model>.entropy`: mean entropy of the choice distributions on each split, in nats."""

    train: float | None
    held_out: float | None
    known: float | None  # nan where the data has no known split


class Calibration(Record):
    """`calibration.<model>`: mean choice entropy per split, and the temperature fitted on the known split."""

    temperature: float | None = None
    entropy: Entropy


class HeadlineTransfer(Record):
    """The original experiment's measure: held-out agreement, student minus control."""

    value: float | None = None
    ci95: Interval = None
    p_value: float | None = None
    mde: float | None = None
    student_teacher_agreement: float
    control_teacher_agreement: float
    replicate_pairs: int


class NumbersCount(Record):
    """`numbers.<label>.replicates[]`: one replicate's sequences generated, kept and rejected."""

    generated: int
    kept: int
    rejected: dict[str, int]


class NumbersMade(Record):
    """`numbers.<label>`: sequences generated, kept and rejected, summed over replicates."""

    generated: int
    kept: int
    rejected: dict[str, int]
    replicates: list[NumbersCount]
    tokens_replaced: int | None = None  # teacher_replaced only
    tokens_unchanged: int | None = None


class LetterPriorRow(Record):
    """`letter_prior.models.<model>`: how often each letter is picked, and the accuracy over the orders."""

    prior: list[float]
    accuracy_over_orders: float


class LetterPrior(Record):
    """`letter_prior`: per model, on the held-out questions, over the orders of the choices scored."""

    orders: int
    models: dict[str, LetterPriorRow]


class OrderAccuracy(Record):
    """`accuracy_by_order.models.<model>.<split>`: accuracy as written and over the orders scored."""

    as_written: float
    over_orders: float
    n: int


class AccuracyByOrder(Record):
    """`accuracy_by_order`: per model and split, accuracy as written and over the orders of the choices scored."""

    orders: int
    models: dict[str, dict[str, OrderAccuracy]]


class Registration(Record):
    """`provenance.registration`: what the run may claim (jobs/rundir/registration.py); its other fields as recorded."""

    model_config = ConfigDict(extra="allow")
    commit: str | None = None
    status: str
    reasons: list[str] = []


class Provenance(Record):
    """`provenance`: the source, packages, seeds and config a report came from, and what it may claim."""

    git_commit: str
    packages: dict[str, str]
    seeds: dict[str, Any]
    model_path: str
    other_base_path: str | None = None
    config: dict[str, Any]  # the resolved config
    registration: Registration  # confirmatory, repeat or exploratory
    # the tiny world: sham_draw, base_weights_sha256, lean (jobs/sources/sham_draw.py)
    world: dict[str, Any] | None = None
    # mode, cpu {model, vector_width}, threads (common/numerics.py); absent before it existed
    numerics: dict[str, Any] | None = None

    @property
    def preset(self) -> str:
        """The preset's name, as the resolved config holds it."""
        return self.config["name"]


class Bar(Record):
    """`timeline.bars[]`: one stage, phase or span on the run's time axis (seconds from `timeline.started`)."""

    lane: str
    kind: str  # stage, phase, or a span's kind (jobs/reporting/timeline.py KINDS)
    start: float
    end: float


class PhaseTime(Record):
    """`timeline.phases.<phase>`: its wall seconds, its compute (the union of its compute spans), the rest."""

    seconds: float
    compute: float
    overhead: float
    parts: dict[str, float]  # seconds of each span kind, summed over the phase's lanes


class Timeline(Record):
    """`timeline`: where the run's time went (jobs/reporting/timeline.py, timeline.png)."""

    started: float | None  # wall-clock time (Unix seconds) of the earliest bar
    bars: list[Bar]
    phases: dict[str, PhaseTime]
    largest_overheads: list[str]  # the three phases with the most time not computing, largest first


class Report(Record):
    """`report.json`."""

    models: dict[str, Accuracy]
    arms: dict[str, Arm]
    contrasts: dict[str, Contrast]
    family: Family
    overt_control: OvertControl | None = None
    positive_control: PositiveControl | None = None
    calibration: dict[str, Calibration]
    sham_fit: ShamFit | None = None
    probes: Probes | None = None
    where_signal_rides: SignalRides | None = None
    transfer: HeadlineTransfer | None = None
    truncated_questions: dict[str, int]
    letter_prior: LetterPrior | None = None
    accuracy_by_order: AccuracyByOrder | None = None
    numbers: dict[str, NumbersMade]
    timings: dict[str, float]
    timeline: Timeline | None = None  # reports kept from before timelines (results/) have none
    provenance: Provenance

    @classmethod
    def parse(cls, data: dict) -> Report:
        """The report a report.json's content holds; ReportShapeError naming each field that is not as declared."""
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]]
            raise ReportShapeError(
                "report.json would not match its schema (jobs/reporting/schema.py): " + "; ".join(problems)
            ) from None

    @classmethod
    def load(cls, path: Path) -> Report:
        """A report.json on disk (one kept under results/ too)."""
        return cls.parse(json.loads(Path(path).read_text()))

    def comparisons(self, with_base: bool = False) -> dict[str, tuple[str, Comparison, Arm | None]]:
        """{name: (what it is measured against, its comparison, the arm or None)}: every arm with a
        transfer, then every contrast as `contrast <name>`; `with_base`: then every arm's reading
        against its base as `<arm> vs <base>`, where its reference is another arm."""
        out = {name: (arm.against, arm.transfer, arm) for name, arm in self.arms.items() if arm.transfer is not None}
        out |= {f"contrast {name}": (c.against, c, None) for name, c in self.contrasts.items()}
        if with_base:
            out |= {
                f"{name} vs {arm.base}": (arm.base, arm.against_base, arm)
                for name, arm in self.arms.items()
                if arm.against_base is not None
            }
        return out


class ReportShapeError(ValueError):
    """A report that does not have report.json's shape: a bug in the report phase, named by its path."""


def check_report(report: dict) -> None:
    """Raise ReportShapeError naming each field of `report` (report.json's content) that is not as `Report` declares it."""
    Report.parse(report)


def _type(hint) -> str:
    """A field's type as docs/report.md writes it (a table cell: no pipes): `dict[str, Result] or null`."""
    if hint is type(None):
        return "null"
    if hint is Any:
        return "any"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]"
    return hint.__name__


def _extra_type(model: type[BaseModel]):
    """The type of the fields a model takes beyond those it declares (SplitResults' metrics), or None."""
    extra = typing.get_type_hints(model).get("__pydantic_extra__")
    return typing.get_args(extra)[1] if extra else None


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """`root` and every model its fields reach, in the order first reached."""
    found, queue = [], [root]
    while queue:
        model = queue.pop(0)
        if model in found:
            continue
        found.append(model)
        for hint in [f.annotation for f in model.model_fields.values()] + [_extra_type(model)]:
            stack = [hint]
            while stack:
                h = stack.pop()
                stack += typing.get_args(h)
                if isinstance(h, type) and issubclass(h, BaseModel):
                    queue.append(h)
    return found


def schema_markdown() -> str:
    """docs/report.md's section "Schema": one table per model, every field with its type."""
    lines = [
        "## Schema",
        "",
        "Generated from `jobs/reporting/schema.py` and `jobs/stats/results.py` (`python -m jobs.reporting.schema --write docs/report.md`);",
        "the report phase builds every report as these models. `?`: may be absent or null.",
        "",
    ]
    for model in _models(Report):
        lines += [
            f"### `{model.__name__}`",
            "",
            (model.__doc__ or "").strip().splitlines()[0],
            "",
            "| field | type |",
            "|---|---|",
        ]
        for name, field in model.model_fields.items():
            lines.append(f"| `{name}`{'' if field.is_required() else '?'} | `{_type(field.annotation)}` |")
        if extra := _extra_type(model):
            lines.append(f"| any other | `{_type(extra)}` |")
        lines.append("")
    return "\n".join(lines)


BEGIN, END = "<!-- schema: generated, do not edit -->", "<!-- end of schema -->"


def with_schema(doc: str) -> str:
    """`doc` with the text between its schema markers replaced by schema_markdown()."""
    head, rest = doc.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{schema_markdown()}\n{END}{rest.split(END, 1)[1]}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Print report.json's schema as markdown, or write it into a document between its markers."
    )
    parser.add_argument("--write", type=Path, help="a markdown file holding the schema markers (docs/report.md)")
    args = parser.parse_args()
    if args.write:
        args.write.write_text(with_schema(args.write.read_text()))
    else:
        print(schema_markdown())
