"""The run's cast: the models an experiment has as a whole, worked out from its arm models.

jobs/experiment/arms.py resolves each (arm, replicate) on its own; the questions about the whole set
are answered here, each by one function: which teachers are trained (`teachers_used`), which numbers
are made (`number_sets`), which arm is the overt positive control (`overt_arm`) and, once training
has recorded them in the manifest, each arm model's snapshots (`snapshot_points`). The stage graph,
the phases and the sizing call these; the report reads them all at once, as a `Cast` made by
`cast_of` before any section is built, so no section works the set out again from the arm models.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.experiment.arms import OTHER_BASE, ArmModel
from jobs.experiment.records import TrainedOutputs
from jobs.experiment.rows_kinds import KINDS, SHAM
from jobs.rundir.manifest import Manifest


def teachers_used(models: list[ArmModel]) -> list[str]:
    """The teacher, and the letter teacher and the sham teacher when some arm learns from them."""
    return ["teacher"] + [name for name in ("letter_teacher", SHAM) if any(m.teacher == name for m in models)]


def overt_arm(models: list[ArmModel]) -> str | None:
    """The overt positive control: the first arm taught its teacher's answers directly (`numbers:
    teacher_answers`) by the teacher itself, not the sham."""
    return next((m.arm for m in models if m.kind.answers and m.teacher == "teacher"), None)


def number_sets(models: list[ArmModel]) -> list[tuple[str, int]]:
    """The (source, replicate) pairs of numbers some arm model reads, replicate by replicate, in
    the table's order (a rewritten kind after what it derives from: made too, though no arm reads
    it). Every source read at all is made for each replicate that any arm has, so the arms of a
    replicate can train on equally many rows. Answers are no numbers: none here."""
    used = {m.source for m in models}
    used |= {KINDS[s].derived_from for s in used if KINDS[s].derived_from}
    sources = [s for s, kind in KINDS.items() if s in used and not kind.answers]
    return [(s, i) for i in range(max(m.replicate for m in models) + 1) for s in sources]


def snapshot_points(manifest: Manifest, model: str) -> list[tuple[int, str]]:
    """(step, scored name) of each snapshot an arm model's training kept (`train.snapshots`), in
    step order: `<model>@<step>` (eval/<model>@<step>.jsonl), and the model itself at its last step."""
    return _points(model, manifest.outputs(model, TrainedOutputs))


def earlier_snapshots(manifest: Manifest, model: str) -> list[tuple[int, str]]:
    """snapshot_points before the last: scored under names of their own."""
    return [point for point in snapshot_points(manifest, model) if point[1] != model]


def _points(model: str, trained: TrainedOutputs) -> list[tuple[int, str]]:
    return [(step, model if step == trained.steps else f"{model}@{step}") for step in trained.snapshot_steps]


@dataclass(frozen=True)
class Cast:
    """Every model of a finished run as the report reads it, worked out once (`cast_of`)."""

    models: tuple[ArmModel, ...]  # the arm models, in the expansion's order
    teachers: tuple[str, ...]  # teachers_used
    # the models no arm trains: the base (and the other base, when an arm declares one) and the teachers
    fixed: tuple[str, ...]
    overt: str | None  # overt_arm
    number_sets: tuple[tuple[str, int], ...]  # number_sets
    trained: dict[str, TrainedOutputs]  # what each arm model's training recorded (steps, loss, init, rows)
    teacher_init: str | None  # the teacher's LoRA init digest, which an arm model's is compared with
    points: dict[str, list[tuple[int, str]]]  # each arm model's snapshot_points

    @property
    def final(self) -> list[str]:
        """Every model as trained: the fixed ones, then the arm models (no earlier snapshot)."""
        return [*self.fixed, *(m.name for m in self.models)]

    @property
    def scored(self) -> list[str]:
        """Every name scored in eval/: the models as trained, then each arm model's earlier snapshots."""
        earlier = [name for m in self.models for _, name in self.points[m.name] if name != m.name]
        return self.final + earlier

    @property
    def arms(self) -> dict[str, list[ArmModel]]:
        """{arm: its models, by replicate}, in the expansion's order."""
        return {m.arm: [n for n in self.models if n.arm == m.arm] for m in self.models}

    @property
    def replicates(self) -> int:
        """How many replicates the run's arms have at most (a set of numbers is made for each)."""
        return max(m.replicate for m in self.models) + 1


def cast_of(models: list[ArmModel], manifest: Manifest) -> Cast:
    """The run's cast: the arm models as the expansion resolved them, and what their training
    recorded in the manifest (each read once here)."""
    teachers, overt, sets = teachers_used(models), overt_arm(models), number_sets(models)
    on_other = any(m.base == OTHER_BASE for m in models)
    trained = {m.name: manifest.outputs(m.name, TrainedOutputs) for m in models}
    return Cast(
        models=tuple(models),
        teachers=tuple(teachers),
        fixed=("base", *((OTHER_BASE,) if on_other else ()), *teachers),
        overt=overt,
        number_sets=tuple(sets),
        trained=trained,
        teacher_init=manifest.output("teacher", "init_hash"),
        points={name: _points(name, out) for name, out in trained.items()},
    )
