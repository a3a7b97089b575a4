"""What an arm can train on, as one table: every kind of rows, what makes it, and what it allows.

An arm's `numbers` names a kind (`<kind>_shuffled`: the same rows, each row's numbers shuffled).
Each kind is one frozen record below. The config check and the arm expansion
(jobs/experiment/arms.py), the stage graph (jobs/experiment/stages.py), the numbers phase, the
wall-time projection, the report's labels and the share analysis read the records and nothing
else about kinds: a new kind is one entry, plus a maker in jobs/phases/numbers.py (`REWRITERS`)
only when its rows are made a way no kind makes them yet.

How rows are made (`made`):
- "sampled": the service samples number sequences from `generator`'s adapter (None: the base
  model) at the preset's sampling settings, the temperature overridden where the kind says;
- "rewritten": `derived_from`'s kept rows of the same replicate, rewritten by the kind's maker
  (the replaced numbers: their most divergent tokens replaced by the base model's argmax);
- "answers": the arm's teacher's own picks on its train questions, as rows (the overt positive
  control): no numbers, so no replicate seed and no equal row count across arms.

A sham arm (`teacher: sham`) is its twin on the sham teacher: on a kind the teacher samples, the
sham samples its rows instead (`sham_source`); a kind that allows no sham arm says so in `teachers`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from train.axes import MASKS

SHAM = "sham_teacher"  # the reference teacher's trained and scored name; an arm names it `teacher: sham`
LEARNERS = ("teacher", "letter_teacher", SHAM)  # the models an arm may learn from


@dataclass(frozen=True)
class RowsKind:
    name: str  # the arm's `numbers`, and the source its stages and files are named by (numbers/<name>/<i>)
    made: Literal["sampled", "rewritten", "answers"]
    label: str  # its key in report.json's `numbers`
    generator: str | None = "teacher"  # sampled: whose adapter (None: the base model)
    temperature: float | None = None  # sampled: replaces numbers.temperature (greedy: 0)
    derived_from: str | None = None  # rewritten: the kind whose kept rows of the replicate it rewrites
    # (key, config path) its stages read beyond the numbers' own (their identity)
    reads: tuple[tuple[str, str], ...] = ()
    forwards_per_row: int = 0  # scoring forward passes per kept row its maker runs (the wall-time projection)
    losses: tuple[str, ...] = ("sft", "logit_kl")  # the losses an arm on it may use
    teachers: tuple[str, ...] = LEARNERS  # the teachers an arm on it may learn from
    # the teacher's numbers in some form: an sft arm on it is measured against the control
    teachers_numbers: bool = True
    signal: str | None = None  # where the signal can ride: the arm's kind in the share analysis (docs/report.md)
    sham_source: str | None = None  # the kind the sham samples for a sham arm on this one
    declarable: bool = True  # an arm may name it (the sham's own numbers are reached through `teacher: sham`)
    shuffles: bool = False  # `<name>_shuffled` is declarable too

    @property
    def answers(self) -> bool:
        """Its rows are the teacher's answers, not numbers: no replicate seed, no equal row count across arms."""
        return self.made == "answers"


# In the order their stages are made and listed: a rewritten kind after what it derives from.
KINDS: dict[str, RowsKind] = {
    kind.name: kind
    for kind in (
        RowsKind("teacher", "sampled", "teacher", sham_source=SHAM, shuffles=True),
        RowsKind(
            "teacher_greedy",
            "sampled",
            "teacher_greedy",
            temperature=0.0,
            losses=("sft",),
            teachers=("teacher",),
            signal="greedy",
        ),
        RowsKind(SHAM, "sampled", SHAM, generator=SHAM, teachers=(SHAM,), declarable=False),
        RowsKind(
            "base", "sampled", "control", generator=None, teachers=("teacher", "letter_teacher"), teachers_numbers=False
        ),
        RowsKind(
            "teacher_replaced",
            "rewritten",
            "teacher_replaced",
            derived_from="teacher",
            reads=(("numbers.replace_fraction", "numbers.replace_fraction"), ("max_length", "student.max_length")),
            forwards_per_row=2,
            losses=("sft",),
            teachers=("teacher",),
            signal="replaced",
        ),
        RowsKind(
            "teacher_answers",
            "answers",
            "answers",
            generator=None,
            losses=("sft",),
            teachers=("teacher", SHAM),
            teachers_numbers=False,
        ),
    )
}


def declared_kind(numbers: str, where: str) -> tuple[RowsKind, bool]:
    """(kind, shuffled) of an arm's `numbers`; ValueError naming `where` and the choices for any other value."""
    name, shuffled = (numbers.removesuffix("_shuffled"), True) if numbers.endswith("_shuffled") else (numbers, False)
    kind = KINDS.get(name)
    if kind is None or not kind.declarable or (shuffled and not kind.shuffles):
        raise ValueError(f"{where}: {numbers!r} is not one of {declarable()}")
    return kind, shuffled


def declarable() -> list[str]:
    """Every value an arm's `numbers` may take."""
    return [
        name
        for kind in KINDS.values()
        if kind.declarable
        for name in (kind.name, f"{kind.name}_shuffled")[: 2 if kind.shuffles else 1]
    ]


def source_for(kind: RowsKind, teacher: str) -> str:
    """The rows an arm on `kind` learning from `teacher` reads: the sham's own where it learns from the sham."""
    return kind.sham_source if teacher == SHAM and kind.sham_source else kind.name


def generator_of(source: str) -> str | None:
    """The model whose adapter makes a source's rows (None: the base model); a rewritten kind's is
    that of what it derives from."""
    kind = KINDS[source]
    return generator_of(kind.derived_from) if kind.derived_from else kind.generator


def signal_kind(kind: RowsKind, mask: str) -> str | None:
    """What an arm on `kind`, trained under `mask`, changes about where the signal can ride
    (docs/report.md), or None. The arm expansion asks once per arm (ArmModel.signal)."""
    if MASKS[mask].drops_tokens:
        return f"{mask} mask"
    return kind.signal
