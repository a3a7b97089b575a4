"""The experiment's stages: each one's name, phase, reads and upstream (the generic plan is jobs/rundir/plan.py).

    data                  the split of the WMDP questions         reads data.*, evaluate.format, the questions
    teacher               LoRA on the teacher-train split         reads model.*, teacher.*; data
    letter_teacher        the same, every answer one letter       reads model.*, teacher.*, letter_teacher.*;
                          (when an arm names it)                  data
    sham_teacher          the same, on the sham's facts (or the   reads model.*, teacher.*, sham_teacher.*;
                          answers permuted; when an arm names it) data
    numbers/<source>/<i>  kept number sequences of replicate i    reads model.*, numbers.*, the engine;
                          (source: teacher, sham_teacher, base)   the source model (but the base)
    answers/<teacher>     the teacher's picks on its train         reads model.*, the engine, evaluate.format;
                          questions, as training rows (an arm     data, that teacher
                          with numbers: teacher_answers)
    <arm>/<i>             an arm's LoRA on its replicate's rows   reads model.*, its resolved training
                                                                  settings, source, loss; its numbers
                                                                  (and the teacher, under logit_kl)
                          (an arm on the other base reads that base too; lora_init teacher_a, the teacher)
    eval/<model>          per-question scores of one model on     reads model.*, evaluate.engine,
                          both splits (train, held_out), and of   evaluate.format, service.max_model_len,
                          each of its snapshots (`train.snapshots`);  the orders scored (evaluate.permutations;
                          `other_base` when an arm declares one   1 under cloze); data, the model
    report                report.json / .md / .png                reads evaluate.primary_*, arms,
                                                                  contrasts, the family; all above

A hub source's revision key (`model.revision`, `data.revision`, an arm's `base_revision`) is read
folded into its source's own key (`model.path: org/name@<commit>`, `data.source: hub@<commit>`, the
other base's `base`), and only when set (pins_in_place), so stages made before the keys existed
keep their identity. Every stage that reads model.* reads `numerics` too: the CPU arithmetic it computes under
(common/numerics.py). Config values are read from the config as written (before `auto` counts are
resolved for the cluster at hand), so the same preset on a bigger cluster reuses
what it made on a smaller one. Settings that only place or pace work are not
read: they do not change what a stage makes (replicas, CPUs and chunk sizes of
scoring, and a fine-tune's PACING fields, train/config.py). Every other key a
stage reads is in its identity, at any value; a key the code adds later is read
at its default where a stored stage lacks it (jobs/rundir/plan.py), so adding
one reruns nothing stored; `numerics` and `model.tiny_numerics` alone are read there as `native`,
what such a stage was computed under and on, so the pinned mode, and the pinned tiny base (the
default since 2026-11-29), make it again.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from common.model_source import pinned
from jobs.experiment.arms import OTHER_BASE, ArmModel, numbers_seed
from jobs.experiment.bases import other_base_identity
from jobs.experiment.cast import number_sets, teachers_used
from jobs.experiment.config import ExperimentConfig, as_dict
from jobs.experiment.records import (
    AnswersOutputs,
    DataOutputs,
    EvalOutputs,
    NumbersOutputs,
    ReplacedOutputs,
    TrainedOutputs,
)
from jobs.experiment.rows_kinds import KINDS, SHAM, generator_of
from jobs.rundir.manifest import Manifest, flatten
from jobs.rundir.plan import Stage, config_reads
from jobs.sources.number_sequences import FILTER_VERSION
from train.axes import INITS, LOSSES
from train.config import PACING, TrainConfig

TEACHERS = ("teacher", "letter_teacher", SHAM)  # models trained on the questions; each keeps <name>/adapter
# what eval/<model> scores, under data/
SPLIT_FILES = {"train": "train_questions.jsonl", "held_out": "held_out.jsonl", "known": "known.jsonl"}
TEACHER_TRAIN = "data/teacher_train.jsonl"  # the teacher's training rows
PROBES_FILE = "data/probes.jsonl"  # the tiny world's probe rows, with evaluate.probes (jobs/sources/world_probes.py)


def numbers_stage(source: str, replicate: int) -> str:
    return f"numbers/{source}/{replicate}"


def trained_folder(name: str, full: bool = False) -> str:
    """What training made for a model, relative to the run directory: a teacher's adapter at
    `<name>/adapter`, an arm model's at `arms/<arm>/<i>/adapter`, or, fully fine-tuned (`full`),
    its model folder at `arms/<arm>/<i>/model`."""
    return f"{name}/adapter" if name in TEACHERS else f"arms/{name}/{'model' if full else 'adapter'}"


def pins_in_place(reads: dict, source_key: str, revision_key: str) -> dict:
    """Reads with a hub source's revision folded into the source's own key (`org/name@<commit>`,
    what every reader gets: common/model_source.py), so an unset revision leaves a stage's identity
    as it was before the key existed, and setting, changing or removing one reruns what reads it."""
    out = {k: v for k, v in reads.items() if k != revision_key}
    out[source_key] = pinned(reads[source_key], reads[revision_key])
    return out


def identity(reads: dict) -> dict:
    """A stage's reads without the fine-tune fields that only pace or place it (PACING)."""
    return {key: value for key, value in reads.items() if key.rsplit(".", 1)[-1] not in PACING}


@cache
def read_defaults() -> dict:
    """Each read key's value when unset: the default experiment's, and an arm's training settings'."""
    train = flatten(TrainConfig().model_dump(), "train.")
    # numerics, model.tiny_numerics: a stage recorded before the key existed was computed natively, on
    # a tiny base built natively (common/numerics.py)
    return {
        **flatten(as_dict(ExperimentConfig())),
        **train,
        "lora_init": "seed",
        "numerics": "native",
        "model.tiny_numerics": "native",
    }


def numbers_file(source: str, replicate: int) -> str:
    """The kept sequences of numbers_stage(source, replicate), relative to the run directory."""
    return f"numbers/{source}/{replicate}.jsonl"


def answers_stage(teacher: str) -> str:
    return f"answers/{teacher}"


def answering_teacher(stage) -> str | None:
    """The teacher whose answers an answers stage makes (answers_stage's inverse); None for any other stage."""
    return stage.name.removeprefix("answers/") if stage.name.startswith("answers/") else None


def answers_file(teacher: str) -> str:
    """answers_stage's rows, relative to the run directory."""
    return f"answers/{teacher}.jsonl"


def rows_of(m: ArmModel) -> tuple[str, str]:
    """(stage, file) of what an arm model trains on: its replicate's numbers of its source, or its
    teacher's answers (the overt positive control)."""
    if KINDS[m.source].answers:
        return answers_stage(m.teacher), answers_file(m.teacher)
    return numbers_stage(m.source, m.replicate), numbers_file(m.source, m.replicate)


def eval_stage(model: str) -> str:
    return f"eval/{model}"


def scored_model(stage) -> str:
    """The model an eval stage scores (eval_stage's inverse)."""
    return stage.name.removeprefix("eval/")


def scored_file(name: str) -> str:
    """A scored model's (or snapshot's) per-question scores, relative to the run directory."""
    return f"eval/{name}.jsonl"


def training_rows(manifest: Manifest, models: list[ArmModel], replicate: int) -> int | None:
    """Every arm of a replicate trains on equally many rows (the fewest any source kept), so arms
    differ in content alone. Sources whose numbers have not finished yet are left out; once they
    finish the value is computed again before the arms run."""
    stages = [numbers_stage(s, i) for s, i in number_sets(models) if i == replicate]
    kept = [manifest.outputs(stage, NumbersOutputs).kept for stage in stages if manifest.entry(stage)]
    return min(kept) if kept else None


def experiment_stages(cfg: ExperimentConfig, models: list[ArmModel], questions_hash: str) -> list[Stage]:
    """Every stage of the experiment, in dependency order: each kind's stages (the table of the
    module's docstring) built by its own function below, then every read key's default attached."""
    config = as_dict(cfg)
    model = _model_reads(cfg, config)
    teachers = teachers_used(models)
    other = {"base": other_base_identity(cfg)}  # what an arm on the other base, and its scores, read
    stages = [
        _data_stage(cfg, config, questions_hash),
        *_teacher_stages(config, model, teachers),
        *_numbers_stages(cfg, config, model, models),
        *_answers_stages(config, model, models, teachers),
        *_arm_stages(model, models, other),
        *_eval_stages(cfg, config, model, models, teachers, other),
    ]
    stages.append(_report_stage(cfg, config, stages))
    defaults = read_defaults()
    return [dataclasses.replace(s, defaults={k: defaults[k] for k in s.reads if k in defaults}) for s in stages]


def _model_reads(cfg: ExperimentConfig, config: dict) -> dict:
    """What every stage that uses the base reads of it: model.* (its revision folded into model.path)
    and the CPU arithmetic every stage computes under (`numerics`)."""
    model = pins_in_place(config_reads(config, "model", "numerics"), "model.path", "model.revision")
    if cfg.model.path != "tiny":  # how a tiny base is built is no part of a hub model's stages
        del model["model.tiny_numerics"]
    return model


def _data_stage(cfg: ExperimentConfig, config: dict, questions_hash: str) -> Stage:
    """The split of the questions: data.* (its revision folded into data.source), the format and
    probes it writes rows for, and the questions themselves (`questions_hash`)."""
    return Stage(
        "data",
        "data",
        {
            **pins_in_place(
                config_reads(config, "data", "evaluate.format", "evaluate.probes"), "data.source", "data.revision"
            ),
            "questions": questions_hash,
        },
        files=(
            TEACHER_TRAIN,
            *(f"data/{f}" for f in SPLIT_FILES.values()),
            *((PROBES_FILE,) if cfg.evaluate.probes else ()),
        ),
        record=DataOutputs,
    )


def _teacher_stages(config: dict, model: dict, teachers: list[str]) -> list[Stage]:
    """The teacher; the positive control's letter teacher, the reference's sham teacher: each reads
    teacher.* and its own section on top, less the settings that only pace training."""
    stages = []
    for teacher in teachers:
        sections = ("teacher",) if teacher == "teacher" else ("teacher", teacher)
        reads, files = identity({**model, **config_reads(config, *sections)}), (trained_folder(teacher),)
        stages.append(Stage(teacher, "teacher", reads, ("data",), files=files, record=TrainedOutputs))
    return stages


def _numbers_stages(cfg: ExperimentConfig, config: dict, model: dict, models: list[ArmModel]) -> list[Stage]:
    """Each (source, replicate) of numbers some arm trains on: the generator's sequences, kept by the
    filter, under the replicate's seed; a key a rows kind declares (`reads`) is read by that kind alone."""
    engine = config_reads(config, "numbers", "service.engine", "service.max_model_len")
    own = {path: config_reads(config, path)[path] for kind in KINDS.values() for _, path in kind.reads}
    for path in own:  # read by the kinds that declare them alone
        engine.pop(path, None)
    stages = []
    for source, i in number_sets(models):
        kind, generator = KINDS[source], generator_of(source)
        kind_reads = {key: own[path] for key, path in kind.reads}
        reads = {
            **model,
            **engine,
            "source": source,
            "seed": numbers_seed(cfg, i),
            "filter": FILTER_VERSION,
            **kind_reads,
        }
        upstream = (generator,) if generator else ()
        if kind.derived_from:  # another kind's kept rows, rewritten
            upstream += (numbers_stage(kind.derived_from, i),)
        record = ReplacedOutputs if kind.made == "rewritten" else NumbersOutputs  # the one rewriter: teacher_replaced
        files = (numbers_file(source, i),)
        stages.append(Stage(numbers_stage(source, i), "numbers", reads, upstream, files=files, record=record))
    return stages


def _answers_stages(config: dict, model: dict, models: list[ArmModel], teachers: list[str]) -> list[Stage]:
    """The overt positive control's rows: each teacher's picks on its train questions, for the
    teachers an arm with answers (teacher_answers) learns from."""
    answering = [t for t in teachers if any(KINDS[m.source].answers and m.teacher == t for m in models)]
    serving = config_reads(config, "service.engine", "service.max_model_len", "evaluate.format")
    stages = []
    for teacher in answering:
        reads, files = {**model, **serving, "teacher": teacher}, (answers_file(teacher),)
        stages.append(
            Stage(answers_stage(teacher), "numbers", reads, ("data", teacher), files=files, record=AnswersOutputs)
        )
    return stages


def _arm_stages(model: dict, models: list[ArmModel], other: dict) -> list[Stage]:
    """Each arm model's training: its resolved settings (less pacing), rows, loss, teacher and init;
    upstream its rows' stage, and its teacher where the loss or the init reads it. An arm on numbers
    also reads how many rows its replicate trains on, known once the numbers finish (training_rows)."""
    stages = []
    for m in models:
        reads = {
            **model,
            **identity(flatten(m.train.model_dump(), "train.")),
            "source": m.source,
            "shuffled": m.shuffled,
            "loss": m.loss,
            "learns_from": m.teacher,
            "lora_init": m.lora_init,
            **(other if m.base == OTHER_BASE else {}),
        }
        # the teacher read too: its soft labels (the loss), or its A (the init)
        uses_teacher = LOSSES[m.loss].needs_teacher or INITS[m.lora_init].reads_teacher_adapter
        upstream = (rows_of(m)[0],) + ((m.teacher,) if uses_teacher else ())
        # answers: all of them, no numbers to equalise
        derived = None if KINDS[m.source].answers else _equal_rows(models, m.replicate)
        files = (trained_folder(m.name, m.full),)
        stages.append(Stage(m.name, "arms", reads, upstream, derived, files=files, record=TrainedOutputs))
    return stages


def _equal_rows(models: list[ArmModel], replicate: int):
    """An arm model's `derived` read: the rows every arm of its replicate trains on (training_rows)."""

    def rows(manifest: Manifest) -> dict:
        return {"rows": training_rows(manifest, models, replicate)}

    return rows


def _eval_stages(
    cfg: ExperimentConfig, config: dict, model: dict, models: list[ArmModel], teachers: list[str], other: dict
) -> list[Stage]:
    """The scores of every model on every split: the base (and the other base, when an arm declares
    one), each teacher, each arm model; all read the same scoring settings and orders."""
    scoring = {
        **model,
        **config_reads(config, "evaluate.engine", "service.max_model_len", "evaluate.format", "evaluate.probes"),
        "splits": list(SPLIT_FILES),
        "evaluate.permutations": cfg.evaluate.orders(),  # the orders scored: one under cloze, whatever is set
    }
    bases = [("base", (), {})] + ([(OTHER_BASE, (), other)] if any(m.base == OTHER_BASE for m in models) else [])
    arms = [(m.name, (m.name,), other if m.base == OTHER_BASE else {}) for m in models]
    stages = []
    for name, upstream, extra in bases + [(t, (t,), {}) for t in teachers] + arms:
        reads, files = {**scoring, **extra}, (scored_file(name),)
        stages.append(Stage(eval_stage(name), "evaluate", reads, ("data", *upstream), files=files, record=EvalOutputs))
    return stages


def _report_stage(cfg: ExperimentConfig, config: dict, stages: list[Stage]) -> Stage:
    """The report: the primary verdict's settings, the arms, contrasts and family it reads, upstream
    every numbers, arms and evaluate stage before it."""
    everything = tuple(s.name for s in stages if s.phase in ("numbers", "arms", "evaluate"))
    reads = config_reads(
        config, "evaluate.primary_metric", "evaluate.primary_split", "evaluate.primary_direction", "arms", "replicates"
    )
    # a pin is read only when set
    reads = {k: v for k, v in reads.items() if not (k.endswith(".base_revision") and v is None)}
    # Holm across the primary verdicts
    reads |= {"contrasts": config["contrasts"], "family": cfg.evaluate.primary_comparisons or "every comparison"}
    return Stage("report", "report", reads, everything, files=("report.json",))
