"""report.md: the report's tables in Markdown, read from a `Report` (jobs/reporting/schema.py).

Accuracy per model and replicate, the headline transfer, the sham's fit, the overt control, where
the signal rides, the evidence section (verdicts, the family of primary verdicts, each comparison's
tests, its metrics side by side in every direction, its weight-space reading, its series against
training steps), the accuracy over orders, the calibration, the letter prior, the numbers made and
the phase timings. The sentences are jobs/stats/verdicts.py's and jobs/stats/share.py's.
"""

from __future__ import annotations

import string

import numpy as np

from jobs.experiment.stages import SPLIT_FILES
from jobs.reporting.schema import AccuracyByOrder, Arm, Calibration, Contrast, Report
from jobs.stats.evidence import SERIES, SPLITS
from jobs.stats.results import ByStep, Comparison, Estimate, Family, Probes, Result, ShamFit, SignalRides, WeightSpace
from jobs.stats.share import phrase
from jobs.stats.verdicts import describe_test, interval

# the choices' letters, as serve/mc_format.LETTERS (jobs/reporting does not import serve)
LETTERS = string.ascii_uppercase


def markdown(report: Report) -> str:
    """report.md's text."""
    subsets = sorted({k for m in report.models.values() for k in m.accuracy if k != "overall"})
    lines = [
        "# Subliminal learning on WMDP",
        "",
        "Held-out accuracy; an arm's row is the mean over its replicates (CI over replicates and questions).",
        "",
        "| model | overall | 95% CI | " + " | ".join(subsets) + " | n | replicates |",
        "|---|---|---|" + "---|" * len(subsets) + "---|---|",
    ]
    for name, m in report.models.items():
        cells = [f"{m.overall:.3f}", interval(m.ci95)] + [f"{m.accuracy.get(s, float('nan')):.3f}" for s in subsets]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {m.n} | {m.replicates or 1} |")
    lines += [
        "",
        "| arm model | base | accuracy | agreement with teacher | LoRA seed | same init as teacher | steps | update cosine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in report.arms.values():
        for r in arm.replicates:
            cosine = "-" if r.update_cosine is None else format(r.update_cosine, "+.3f")
            lines.append(
                f"| {r.model} | {arm.base} | {r.overall:.3f} | {r.teacher_agreement:.3f} | {r.lora_seed} | {r.same_init_as_teacher} | {r.steps} | {cosine} |"
            )
    lines += [
        "",
        "Update cosine: the cosine between the arm model's LoRA update (B A) and its teacher's, per module, averaged (jobs/stats/weight_space.py).",
    ]
    if (t := report.transfer) is not None:
        lines += [
            "",
            f"**Transfer** (held-out agreement with the teacher, student minus control, {t.replicate_pairs} "
            f"replicate(s) each): {t.value:+.3f} (95% CI {interval(t.ci95)}; "
            f"student {t.student_teacher_agreement:.3f}, control {t.control_teacher_agreement:.3f})",
        ]
    cut = report.truncated_questions
    if any(cut.values()):
        lines += [
            "",
            "Questions longer than the context, scored on their end (cut from the left): "
            + ", ".join(f"{split} {n}" for split, n in cut.items()),
        ]
    if report.sham_fit is not None:
        lines += sham_fit_lines(report.sham_fit)
    if report.probes is not None:
        lines += probe_lines(report.probes)
    if report.overt_control is not None:
        lines += ["", f"**Overt positive control.** {report.overt_control.verdict}"]
    if report.where_signal_rides is not None:
        lines += signal_lines(report.where_signal_rides)
    lines += evidence_lines(report)
    lines += order_lines(report.accuracy_by_order)
    lines += calibration_lines(report.calibration, report.arms)
    prior = report.letter_prior
    letters = max(len(m.prior) for m in prior.models.values())
    lines += [
        "",
        f"Letter prior (held out, {prior.orders} order(s) of the choices): how often each letter is picked.",
        "",
    ]
    lines += [
        "| model | " + " | ".join(LETTERS[:letters]) + " | accuracy over orders |",
        "|---|" + "---|" * (letters + 1),
    ]
    for name, m in prior.models.items():
        lines.append(f"| {name} | " + " | ".join(f"{p:.3f}" for p in m.prior) + f" | {m.accuracy_over_orders:.3f} |")
    lines += ["", "| numbers | generated | kept | rejected |", "|---|---|---|---|"]
    for name, n in report.numbers.items():
        rejected = ", ".join(f"{reason}: {count}" for reason, count in sorted(n.rejected.items())) or "none"
        lines.append(f"| {name} | {n.generated} | {n.kept} | {rejected} |")
    lines += ["", "| phase | seconds |", "|---|---|"] + [
        f"| {phase} | {s:.1f} |" for phase, s in report.timings.items()
    ]
    return "\n".join(lines) + "\n"


def order_lines(by_order: AccuracyByOrder) -> list[str]:
    """Accuracy per split as written and over the orders scored: knowledge holds under rotation, a
    letter preference does not."""
    splits = [s for s in SPLIT_FILES if any(s in m for m in by_order.models.values())]
    lines = [
        "",
        f"Accuracy as written / over {by_order.orders} order(s) of the choices (an arm: the mean over its replicates).",
        "",
    ]
    lines += ["| model | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for name, m in by_order.models.items():
        lines.append(
            f"| {name} | " + " | ".join(f"{m[s].as_written:.3f} / {m[s].over_orders:.3f}" for s in splits) + " |"
        )
    return lines


def calibration_lines(calibration: dict[str, Calibration], arms: dict[str, Arm]) -> list[str]:
    """Mean choice entropy per split and the fitted temperature, per model (an arm: the mean over
    its replicates): a move of the log-probability with the entropy up is flattening, not order."""
    rows = {name: [c] for name, c in calibration.items() if "/" not in name}
    rows |= {arm: [calibration[r.model] for r in a.replicates] for arm, a in arms.items()}
    lines = [
        "",
        "Choice entropy in nats (log 4 = 1.386: four flat choices) and the temperature fitted on the known split.",
        "",
    ]
    lines += ["| model | entropy, train | entropy, held out | entropy, known | temperature |", "|---|---|---|---|---|"]
    for name, cs in rows.items():
        mean = [
            float(np.mean([read(c.entropy) for c in cs]))
            for read in (lambda e: e.train, lambda e: e.held_out, lambda e: e.known)
        ]
        taus = [c.temperature for c in cs if c.temperature is not None]
        tau = f"{np.mean(taus):.2f}" if len(taus) == len(cs) else "-"
        lines.append(f"| {name} | " + " | ".join(f"{m:.3f}" for m in mean) + f" | {tau} |")
    return lines


def sham_fit_lines(fit: ShamFit) -> list[str]:
    """Every model on the true answers and on the sham's facts, and the verdict."""
    lines = ["", "Accuracy on the teacher's facts (the true answers) and on the matched sham's, per split:", ""]
    lines += ["| model | true, train | true, held out | sham's, train | sham's, held out |", "|---|---|---|---|---|"]
    for name, a in fit.accuracy.items():
        lines.append(
            f"| {name} | {a.true.train:.3f} | {a.true.held_out:.3f} | {a.sham.train:.3f} | {a.sham.held_out:.3f} |"
        )
    gaps = ", ".join(f"{split} {gap:+.3f} (bound {fit.bounds[split]:.2f})" for split, gap in fit.gaps.items())
    state = (
        "matched" if fit.matched else "NOT matched: the sham differs from the teacher in more than which facts it holds"
    )
    return lines + ["", f"The sham against the teacher, each on its own facts: {gaps}; {state}."]


def probe_lines(probes: Probes) -> list[str]:
    """The gates on each teacher, then each arm's probe readings (train) and what they show."""
    lines = ["", "Probes: knowledge or answer habit (crossed rank leans on train; docs/report.md, Probes):", ""]
    lines += ["| side | against | original | swap | cue-bound | statement | reading |", "|---|---|---|---|---|---|---|"]
    for name, g in probes.gates.items():
        state = "gates pass" if g.passed else "gates fail: " + "; ".join(g.failed)
        cells = [fixed(g.train[r]) for r in ("original", "swap", "cue_bound")] + [fixed(g.statement)]
        lines.append(f"| {name} | base | " + " | ".join(cells) + f" | {state} |")
    for name, a in probes.arms.items():
        lines.append(
            f"| {name} | {a.against} | "
            + " | ".join(short(a.train[r]) for r in ("original", "swap", "cue_bound"))
            + f" | {short(a.statement)} | {a.reading} |"
        )
    return lines


def signal_lines(rides: SignalRides) -> list[str]:
    """The table of shares remaining."""
    lines = [
        "",
        f"**Where the signal rides** ({rides.metric} on {rides.split}): each arm's effect as a share of {rides.student}'s, "
        f"both against {rides.reference}, paired by replicate (Fieller interval by test inversion; docs/report.md).",
        "",
        "| arm | what changed | effect | share remaining |",
        "|---|---|---|---|",
    ]
    for name, s in rides.arms.items():
        effect_cell = "-" if s.arm_effect is None else f"{s.arm_effect:+.4f}"
        lines.append(f"| {name} | {s.kind} | {effect_cell} | {s.note or phrase(s)} |")
    if (d := rides.divergence_vs_random) is not None and d.value is not None:
        ci = "-" if d.ci95 is None else f"{d.ci95[0]:+.4f} to {d.ci95[1]:+.4f}"
        p = "-" if d.p_value is None else f"{d.p_value:.2g}"
        lines.append(
            f"\n{d.arm} minus {d.against} (what the random mask isolates): {d.value:+.4f} (95% CI {ci}, p={p})."
        )
    return lines


def family_table(arms: dict[str, Arm], contrasts: dict[str, Contrast], family: Family) -> list[str]:
    """The preset's primary verdicts side by side: raw p and p Holm-adjusted over the family."""
    which = "declared in evaluate.primary_comparisons" if family.declared else "every comparison: the preset names none"
    lines = [
        "",
        f"Primary verdicts, Holm across the family of {family.size} ({which}); the rest are exploratory, at raw p.",
        "",
    ]
    lines += [
        "| comparison | primary test | difference | 95% CI | p | Holm p (family) | MDE | detected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(f"{name} vs {arm.against}", arm.transfer.primary) for name, arm in arms.items()]
    rows += [(f"contrast {name}: {c.arm} vs {c.against}", c.primary) for name, c in contrasts.items()]
    for title, r in rows:
        lines.append(f"| {title} | {describe_test(r.split, r.metric, r.direction)} | {cells(r)} |")
    return lines


def side_by_side(result: Comparison) -> list[str]:
    """A comparison's metrics in every direction, on the primary split: toward the teacher's picks,
    toward the placebo's (its reference minus the arm), and crossed; raw p (the declared primary
    alone decides; these show whether it holds across metrics and directions)."""
    directions, split = result.directions, result.primary.split
    if directions is None or directions.crossed is None:
        return []
    lines = [
        "",
        f"Side by side on {split} (raw p; the primary decides, these show whether it is robust; placebo: {directions.placebo}):",
        "",
    ]
    lines += ["| metric | toward the teacher's picks | toward the placebo's picks | crossed |", "|---|---|---|---|"]
    for metric in directions.crossed[split]:
        row = [result.cell(split, metric), directions.toward_placebo[split][metric], directions.crossed[split][metric]]
        lines.append(f"| {metric} | " + " | ".join(short(r) for r in row) + " |")
    return lines


def fixed(r: Result) -> str:
    """value (p): a fixed model's result, questions the only chance."""
    if r.value is None:
        return "-"
    return f"{r.value:+.4f}" + ("" if r.p_fixed_models is None else f" (p {r.p_fixed_models:.2g})")


def short(r: Result | Estimate) -> str:
    """value (CI, p): a result's cells in one (an estimate has no p)."""
    if r.value is None:
        return "-"
    p_value = r.p_value if isinstance(r, Result) else None
    p = "" if p_value is None else f", p {p_value:.2g}"
    return f"{r.value:+.4f}" + ("" if r.ci95 is None else f" ({interval(r.ci95)}{p})")


def evidence_lines(report: Report) -> list[str]:
    """The evidence section: verdicts, the family of primary verdicts, then one table per
    comparison, its primary test first."""
    arms, contrasts = report.arms, report.contrasts
    lines = ["", "## Transfer evidence", ""]
    lines += [f"- {arm.verdict}" for arm in arms.values()]
    lines += [f"- {arm.changed.sentence}" for arm in arms.values() if arm.changed is not None]
    lines += [f"- contrast {name}: {c.verdict}" for name, c in contrasts.items()]
    lines += [f"- {report.positive_control.verdict}"] if report.positive_control is not None else []
    lines += family_table(arms, contrasts, report.family)
    comparisons = [
        (f"{name} vs {arm.against} ({arm.reference})", arm.transfer, arm.by_step, arm.weight_space)
        for name, arm in arms.items()
    ]
    comparisons += [
        (f"{name} vs {arm.base} (its base)", arm.against_base, None, None)
        for name, arm in arms.items()
        if arm.against_base is not None
    ]
    comparisons += [(f"contrast {name}: {c.arm} vs {c.against}", c, c.by_step, None) for name, c in contrasts.items()]
    for title, result, series, weights in comparisons:
        lines += comparison_lines(title, result, series, weights)
    return lines


HEAD = ["| split | metric | difference | 95% CI | p | Holm p | MDE | detected |", "|---|---|---|---|---|---|---|---|"]


def comparison_lines(title: str, result: Comparison, series: ByStep | None, weights: WeightSpace | None) -> list[str]:
    """One comparison's table (its primary test first), side by side, weight space and series."""
    primary = result.primary
    crossed = primary.direction == "crossed"
    rest = [
        (s, m)
        for s in SPLITS
        for m, r in result.split(s).metrics.items()
        if (crossed or (s, m) != (primary.split, primary.metric)) and r.value is not None
    ]
    label = f"**{primary.metric}** (primary{', crossed' if crossed else ''})"
    lines = ["", f"### {title}", "", *HEAD, f"| {primary.split} | {label} | {cells(primary)} |"]
    lines += [f"| {split} | {metric} | {cells(result.cell(split, metric))} |" for split, metric in rest]
    lines += side_by_side(result)
    if weights is not None and weights.crossed is not None:
        readings = [
            ("toward teacher", weights.toward_teacher),
            ("toward placebo", weights.toward_placebo),
            ("crossed", weights.crossed),
        ]
        readings = "; ".join(f"{key} {short(r)}" for key, r in readings)
        lines += [
            "",
            f"Weight space (the share of each teacher's LoRA update carried, arm against reference; placebo {weights.placebo}): {readings}.",
        ]
    if series is not None and series.points is not None:
        lines += ["", "Against training steps (each side at the same snapshot):", "", *HEAD]
        for point in series.points:
            steps = ", ".join(str(s) for s in sorted(set(point.steps)))
            lines += [
                f"| {steps}: {split} | {metric} | {cells(point.split(split).metrics[metric])} |"
                for split in SPLITS
                for metric in SERIES
            ]
        if (last := series.last_interval) is not None:
            steps = f"{'/'.join(map(str, last.from_steps))} -> {'/'.join(map(str, last.to_steps))}"
            lines += ["", f"Still learning at the end? {last.metric} on {last.split}, steps {steps}: {cells(last)}"]
    elif series is not None:
        lines += ["", f"Against training steps: {series.note}"]
    return lines


def cells(r: Result) -> str:
    """A test's cells of a table row: difference, CI, p, Holm p, MDE, detected."""
    if r.value is None:
        return f"- | - | - | - | - | {r.note or ''}"
    p, mde = ("-", "-") if r.p_value is None else (f"{r.p_value:.3g}", f"{r.mde:.4f}")
    if r.secondary:
        holm_p = "-" if r.p_holm is None else f"{r.p_holm:.3g}"
    else:  # the primary test: adjusted over the preset's family of primary comparisons
        holm_p = "exploratory" if r.exploratory else ("-" if r.p_family is None else f"{r.p_family:.3g} (family)")
    return f"{r.value:+.4f} | {interval(r.ci95)} | {p} | {holm_p} | {mde} | {r.detected}" + (
        f" ({r.note})" if r.note else ""
    )
