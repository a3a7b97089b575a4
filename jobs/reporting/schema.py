"""The shape of `report.json`, as typed models: what the report phase must write and readers may expect.

The report phase builds the report as plain data and checks it against `Report` before anything is
written (`check_report`): a field misspelled, missing or of the wrong type is an error naming its
path, not a report that a reader (report.md, the plots, MLflow, a user's notebook) finds wrong later.
What each field means is docs/report.md's prose; its section "Schema" is generated from these
models (`python -m jobs.reporting.schema --write docs/report.md`) and a test keeps the two equal.

Sections whose inner shape is still free-form (the statistics of `sham_fit`, `where_signal_rides`,
`by_step`, the resolved config) are typed as mappings; the rest is closed: an unknown field is an error.
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

Interval = list[float | None] | None  # [low, high]; a side None is unbounded; None: no interval


class Closed(BaseModel):
    """A report section whose fields are all declared."""

    model_config = ConfigDict(extra="forbid")


class Result(Closed):
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


class Primary(Result):
    """The test that decides an arm's or a contrast's verdict."""

    split: str
    metric: str
    direction: str


class SplitResults(BaseModel):
    """`<metric>: Result` for every metric on one split, and `mde`: each metric's MDE in one place."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Result]
    mde: dict[str, float | None]


class Directions(Closed):
    """Toward the placebo teacher's picks and crossed: `{<split>: {<metric>: Result}}` each."""

    placebo: str | None = None
    toward_placebo: dict[str, dict[str, Result]] | None = None
    crossed: dict[str, dict[str, Result]] | None = None
    note: str | None = None


class Comparison(Closed):
    """An arm against its reference, or a contrast's two arms: every split and metric, and the primary."""

    train: SplitResults
    held_out: SplitResults
    directions: Directions | None = None
    primary: Primary


class Accuracy(Closed):
    """A model's accuracy: a fixed model's, or an arm's mean over its replicates."""

    accuracy: dict[str, float]
    ci95: Interval = None
    ci95_by_subset: dict[str, Interval] | None = None
    n: int
    accuracy_by_split: dict[str, float] | None = None
    replicates: int | None = None  # an arm: replicates the mean is over
    teacher_agreement: float | None = None  # an arm's mean


class Replicate(Closed):
    """One trained model of an arm."""

    model: str
    accuracy: dict[str, float]
    ci95: Interval = None
    n: int
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


class Spread(Closed):
    """`arms.<arm>.update_cosine`: mean and sd over the replicates."""

    mean: float | None = None
    sd: float | None = None


class Arm(Closed):
    """An arm: as declared, its replicates, and its comparison with what it is measured against."""

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
    weight_space: dict[str, Any] | None = None
    fraction_of_overt: dict[str, Any] | None = None
    by_step: dict[str, Any] | None = None
    verdict: str


class Contrast(Comparison):
    """A declared contrast of two arms (`contrasts.<name>`)."""

    arm: str
    against: str
    by_step: dict[str, Any] | None = None
    verdict: str | None = None


class Family(Closed):
    """`family`: the primary verdicts Holm adjusts over."""

    comparisons: list[str]
    size: int
    declared: bool  # named by evaluate.primary_comparisons, or every comparison


class OvertControl(Closed):
    """`overt_control`: the positive control for knowledge, and whether it was detected."""

    arm: str
    detected: bool
    effect: float | None = None
    verdict: str


class Calibration(Closed):
    """`calibration.<model>`: mean choice entropy per split, and the temperature fitted on the known split."""

    temperature: float | None = None
    entropy: dict[str, float | None]


class HeadlineTransfer(Closed):
    """The original experiment's measure: held-out agreement, student minus control."""

    value: float | None = None
    ci95: Interval = None
    p_value: float | None = None
    mde: float | None = None
    student_teacher_agreement: float
    control_teacher_agreement: float
    replicate_pairs: int


class NumbersMade(Closed):
    """`numbers.<label>`: sequences generated, kept and rejected, summed over replicates."""

    generated: int
    kept: int
    rejected: dict[str, int]
    replicates: list[dict[str, Any]]
    tokens_replaced: int | None = None  # teacher_replaced only
    tokens_unchanged: int | None = None


class ByOrder(Closed):
    """`accuracy_by_order`, `letter_prior`: per model, read over the orders of the choices scored."""

    orders: int
    models: dict[str, dict[str, Any]]


class Provenance(Closed):
    """`provenance`: the source, packages, seeds and config a report came from, and what it may claim."""

    git_commit: str
    packages: dict[str, str]
    seeds: dict[str, Any]
    model_path: str
    other_base_path: str | None = None
    config: dict[str, Any]  # the resolved config
    registration: dict[str, Any]  # confirmatory, repeat or exploratory (jobs/rundir/registration.py)
    world: dict[str, Any] | None = None  # the tiny world: sham_draw, base_weights_sha256, lean (jobs/sources/sham_draw.py)
    numerics: dict[str, Any] | None = None  # mode, cpu {model, vector_width}, threads (common/numerics.py); absent before it existed


class Bar(Closed):
    """`timeline.bars[]`: one stage, phase or span on the run's time axis (seconds from `timeline.started`)."""

    lane: str
    kind: str  # stage, phase, or a span's kind (jobs/reporting/timeline.py KINDS)
    start: float
    end: float


class PhaseTime(Closed):
    """`timeline.phases.<phase>`: its wall seconds, its compute (the union of its compute spans), the rest."""

    seconds: float
    compute: float
    overhead: float
    parts: dict[str, float]  # seconds of each span kind, summed over the phase's lanes


class Timeline(Closed):
    """`timeline`: where the run's time went (jobs/reporting/timeline.py, timeline.png)."""

    started: float | None  # wall-clock time (Unix seconds) of the earliest bar
    bars: list[Bar]
    phases: dict[str, PhaseTime]
    largest_overheads: list[str]  # the three phases with the most time not computing, largest first


class Report(Closed):
    """`report.json`."""

    models: dict[str, Accuracy]
    arms: dict[str, Arm]
    contrasts: dict[str, Contrast]
    family: Family
    overt_control: OvertControl | None = None
    positive_control: dict[str, Any] | None = None
    calibration: dict[str, Calibration]
    sham_fit: dict[str, Any] | None = None
    where_signal_rides: dict[str, Any] | None = None
    transfer: HeadlineTransfer | None = None
    truncated_questions: dict[str, int]
    letter_prior: ByOrder | None = None
    accuracy_by_order: ByOrder | None = None
    numbers: dict[str, NumbersMade]
    timings: dict[str, float]
    timeline: Timeline | None = None  # reports kept from before timelines (results/) have none
    provenance: Provenance


class ReportShapeError(ValueError):
    """A report that does not have report.json's shape: a bug in the report phase, named by its path."""


def check_report(report: dict) -> None:
    """Raise ReportShapeError naming each field of `report` that is not as `Report` declares it."""
    try:
        Report.model_validate(report)
    except ValidationError as err:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()[:5]]
        raise ReportShapeError("report.json would not match its schema (jobs/reporting/schema.py): " + "; ".join(problems)) from None


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
        "Generated from `jobs/reporting/schema.py` (`python -m jobs.reporting.schema --write docs/report.md`);",
        "the report phase checks every report against it before writing. `?`: may be absent or null.",
        "",
    ]
    for model in _models(Report):
        lines += [f"### `{model.__name__}`", "", (model.__doc__ or "").strip().splitlines()[0], "", "| field | type |", "|---|---|"]
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
    parser = argparse.ArgumentParser(description="Print report.json's schema as markdown, or write it into a document between its markers.")
    parser.add_argument("--write", type=Path, help="a markdown file holding the schema markers (docs/report.md)")
    args = parser.parse_args()
    if args.write:
        args.write.write_text(with_schema(args.write.read_text()))
    else:
        print(schema_markdown())
