"""Evidence of transfer for the report: each arm against its reference, and the declared contrasts.

For both splits (`train`: the teacher's own training questions, where the
subliminal-learning theory predicts the student moves first; `held_out`) and
every metric of jobs/transfer_stats.py, the paired difference with its CI,
p-value and MDE. An arm is compared with its reference (`arms.<name>.against`:
the control arm for sft arms on the teacher's numbers, else the base model); a
contrast compares two arms (e.g. same-init against other-init). Both hold the
replicates' spread (jobs/transfer_stats.py).
"""

from __future__ import annotations

import numpy as np

from jobs.arms import ArmModel
from jobs.transfer_stats import BINARY, LOWER_IS_TRANSFER, METRICS, cluster_ids, detected, effect, question_metrics

SPLITS = ("train", "held_out")
PRIMARY = ("agreement", "teacher_answer_logprob")  # the verdict's metrics


def reference_of(arm: str, cfg) -> str:
    """What an arm's transfer is measured against (see ArmConfig.against)."""
    declared = cfg.arms[arm]
    if declared.against != "auto":
        return declared.against
    control = cfg.arms.get("control")
    if arm != "control" and control is not None and control.numbers == "base" and declared.loss == "sft":
        return "control"
    return "base"


def toward_teacher(metric: str, value: float) -> bool:
    return value < 0 if metric in LOWER_IS_TRANSFER else value > 0


class Evidence:
    """Per-question metric values of every scored model, per split, and the comparisons.

    `scores` holds every scored name: base, the teachers, the arm models and their snapshots;
    `points[model]` lists an arm model's (step, scored name) snapshots (jobs/graph.snapshot_points).
    """

    def __init__(self, scores: dict[str, list[dict]], models: list[ArmModel], resamples: int, seed: int, points: dict | None = None):
        self.resamples, self.seed, self.points = resamples, seed, points or {}
        self.members, self.teacher_of = {"base": ["base"]}, {}
        for m in models:
            self.members.setdefault(m.arm, []).append(m.name)
            self.teacher_of[m.arm] = m.teacher
        self.values, self.clusters = {}, {}  # values[teacher][split][model]: metrics against that teacher
        for split in SPLITS:
            rows = {name: [r for r in scored if r["split"] == split] for name, scored in scores.items()}
            for teacher in set(self.teacher_of.values()):
                self.values.setdefault(teacher, {})[split] = {name: question_metrics(r, rows[teacher], rows["base"]) for name, r in rows.items()}
            self.clusters[split] = cluster_ids(rows["base"])

    def _scored(self, side: str, snapshot: int | None) -> list[str]:
        if snapshot is None or side == "base":
            return self.members[side]
        return [self.points[name][snapshot][1] for name in self.members[side]]

    def compare(self, arm: str, against: str, snapshot: int | None = None, metrics=METRICS) -> dict:
        """{split: {metric: {value, ci95, p_value, mde, p_fixed_models, n_questions, n_clusters, detected}, mde: {metric: mde}}},
        for the final models, or for every trained side's `snapshot`-th snapshot."""
        out, values = {}, self.values[self.teacher_of[arm]]
        for split in SPLITS:
            results = {}
            for metric in metrics:
                if against == "base" and metric == "agreement_changed":  # base never agrees there: any change would count
                    results[metric] = {"value": None, "ci95": None, "p_value": None, "mde": None, "p_fixed_models": None, "detected": False,
                                       "note": "not measured against base: the subset is where base disagrees with the teacher"}  # fmt: skip
                    continue
                a = np.array([values[split][name][metric] for name in self._scored(arm, snapshot)])
                b = np.array([values[split][name][metric] for name in self._scored(against, snapshot)])
                r = effect(a, b, self.clusters[split], binary=metric in BINARY, b_fixed=against == "base", resamples=self.resamples, seed=self.seed)
                results[metric] = {**r, "detected": detected(r)}
            results["mde"] = {metric: results[metric]["mde"] for metric in metrics}
            out[split] = results
        return out

    def by_step(self, arm: str, against: str) -> dict | None:
        """Transfer against training steps: the primary metrics at each snapshot, every trained side
        taken at its k-th snapshot (so sides trained alike are compared at the same step). None when
        the arm kept no snapshots; {"note": why} when the sides' snapshots do not line up."""
        sides = [side for side in (arm, against) if side != "base"]
        counts = {side: {len(self.points.get(name, [])) for name in self.members[side]} for side in sides}
        if counts[arm] == {0}:
            return None
        if len(set().union(*counts.values())) != 1:
            return {"note": f"no series: {' and '.join(sides)} kept different numbers of snapshots ({counts}); give both the same train.snapshots"}
        return {"points": [
            {"steps": [self.points[name][k][0] for name in self.members[arm]], **self.compare(arm, against, k, PRIMARY)}
            for k in range(counts[arm].pop())
        ]}  # fmt: skip


def interval(ci) -> str:
    return "-" if ci is None else f"{ci[0]:+.4f} to {ci[1]:+.4f}"


def positive_control(arms: dict) -> dict | None:
    """Did the arms of the letter teacher (the positive control) show transfer? None without them."""
    names = [name for name, arm in arms.items() if arm["teacher"] == "letter_teacher"]
    if not names:
        return None
    detected = any(findings(arms[name]["transfer"]) for name in names)
    sentence = (
        "The positive control (a teacher that always answers one letter) was detected: this experiment can see transfer where there is some."
        if detected else
        "The positive control (a teacher that always answers one letter) was NOT detected: this experiment cannot see even a strong trait transfer, so its null on the teacher says nothing."
    )  # fmt: skip
    return {"arms": names, "detected": detected, "verdict": sentence}


def findings(transfer: dict) -> list[str]:
    """The primary metrics detected in the teacher's direction, each as a phrase."""
    return [
        f"{metric} on {split} {r['value']:+.4f} (95% CI {interval(r['ci95'])}, p={r['p_value']:.2g})"
        for split in SPLITS for metric in PRIMARY
        if (r := transfer[split][metric])["detected"] and toward_teacher(metric, r["value"])
    ]  # fmt: skip


def verdict(name: str, against: str, transfer: dict) -> str:
    """One plain sentence: where transfer was detected, or what size the design could have detected."""
    found = findings(transfer)
    if found:
        return f"{name} vs {against}: transfer detected: " + "; ".join(found) + "."
    mdes = [(split, metric, transfer[split]["mde"][metric]) for split in SPLITS for metric in PRIMARY]
    if any(mde is None for _, _, mde in mdes):
        return f"{name} vs {against}: no transfer detected; with one replicate the spread across seeds is unknown, so no effect size can be promised."
    sizes = "; ".join(f"{split}: " + ", ".join(f"{metric} {mde:.4f}" for s, metric, mde in mdes if s == split) for split in SPLITS)
    return f"{name} vs {against}: no transfer detected; this design would have detected, with 80% power, differences of {sizes}."


def markdown_tables(arms: dict, contrasts: dict) -> list[str]:
    """report.md's evidence section: verdicts, then one table per comparison."""
    lines = ["", "## Transfer evidence", ""]
    lines += [f"- {arm['verdict']}" for arm in arms.values() if "verdict" in arm]
    control = positive_control(arms)
    lines += [f"- {control['verdict']}"] if control else []
    comparisons = [(f"{name} vs {arm['against']}", arm["transfer"], arm.get("by_step")) for name, arm in arms.items()]
    comparisons += [(f"contrast {name}: {c['arm']} vs {c['against']}", c, c.get("by_step")) for name, c in contrasts.items()]
    for title, result, series in comparisons:
        lines += ["", f"### {title}", "", "| split | metric | difference | 95% CI | p | MDE | detected |", "|---|---|---|---|---|---|---|"]
        lines += [
            f"| {split} | {metric} | {_cells(result[split][metric])} |" for split in SPLITS for metric in METRICS if result[split][metric]["value"] is not None
        ]
        if series and "points" in series:
            lines += ["", "Against training steps (each side at the same snapshot):", "",
                      "| steps | split | metric | difference | 95% CI | p | MDE | detected |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
            for point in series["points"]:
                steps = ", ".join(str(s) for s in sorted(set(point["steps"])))
                lines += [f"| {steps} | {split} | {metric} | {_cells(point[split][metric])} |" for split in SPLITS for metric in PRIMARY]
        elif series:
            lines += ["", f"Against training steps: {series['note']}"]
    return lines


def _cells(r: dict) -> str:
    p, mde = ("-", "-") if r["p_value"] is None else (f"{r['p_value']:.3g}", f"{r['mde']:.4f}")
    return f"{r['value']:+.4f} | {interval(r['ci95'])} | {p} | {mde} | {r['detected']}"
