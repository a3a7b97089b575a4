"""Evidence of transfer for the report: each arm against its reference, and the declared contrasts.

For both splits (`train`: the teacher's own training questions, where the
subliminal-learning theory predicts the student moves first; `held_out`) and
every metric of jobs/stats/transfer_stats.py, the paired difference with its CI,
p-value and MDE. An arm is compared with its reference (`arms.<name>.against`:
the control arm for sft arms on the teacher's numbers, else the base model); a
contrast compares two arms (e.g. same-init against other-init). Both hold the
replicates' spread (jobs/stats/transfer_stats.py).
"""

from __future__ import annotations

import numpy as np

from jobs.stats.transfer_stats import BINARY, LOWER_IS_TRANSFER, METRICS, cluster_ids, detected, effect, holm, question_metrics

SPLITS = ("train", "held_out")
SERIES = ("agreement", "teacher_answer_rank", "teacher_answer_logprob")  # followed against training steps and plotted
BASES = ("base", "other_base")  # the scored base models (jobs/experiment/arms.OTHER_BASE is the second)
NEEDS_ONE_BASE = {"agreement_changed"}  # its subset is where the base disagrees with the teacher


def toward_teacher(metric: str, value: float) -> bool:
    return value < 0 if metric in LOWER_IS_TRANSFER else value > 0


class Evidence:
    """Per-question metric values of every scored model, per split, and the comparisons.

    `scores` holds every scored name: the bases, the teachers, the arm models and their snapshots;
    `models` the arm models (each with `arm`, `name`, `teacher`, `base`: jobs/experiment/arms.ArmModel);
    `points[model]` lists an arm model's (step, scored name) snapshots (jobs/phases/stages.snapshot_points).
    Every model's metrics are taken against its own base (teacher_answer_logprob: its log p of the
    teacher's answer minus its base's), so arms on different bases compare changes, not levels.
    `primary` = (split, metric): the one test that decides each comparison.
    """

    def __init__(self, scores: dict[str, list[dict]], models: list, primary: tuple[str, str], points: dict | None = None):
        self.primary, self.points = primary, points or {}
        self.members, self.teacher_of, self.base_of = {b: [b] for b in BASES if b in scores}, {}, {b: b for b in BASES}
        for m in models:
            self.members.setdefault(m.arm, []).append(m.name)
            self.teacher_of[m.arm] = m.teacher
            self.base_of[m.arm] = m.base
        model_base = {m.name: m.base for m in models}  # a snapshot `<model>@<step>` is on its model's base; teachers on base
        own_base = {name: name if name in BASES else model_base.get(name.split("@")[0], "base") for name in scores}
        self.values, self.clusters = {}, {}  # values[teacher][split][model]: metrics against that teacher and its own base
        for split in SPLITS:
            rows = {name: [r for r in scored if r["split"] == split] for name, scored in scores.items()}
            for teacher in set(self.teacher_of.values()):
                self.values.setdefault(teacher, {})[split] = {name: question_metrics(r, rows[teacher], rows[own_base[name]]) for name, r in rows.items()}
            self.clusters[split] = cluster_ids(rows["base"])

    def model_mean(self, name: str, teacher: str, split: str, metric: str) -> float:
        """One scored model's mean of a per-question metric, taken against `teacher`."""
        return float(np.mean(self.values[teacher][split][name][metric]))

    def _scored(self, side: str, snapshot: int | None) -> list[str]:
        if snapshot is None or side in BASES:
            return self.members[side]
        return [self.points[name][snapshot][1] for name in self.members[side]]

    def side_values(self, side: str, split: str, metric: str, snapshot: int | None, teacher: str, change: bool):
        """[replicates x questions] of one side; with `change`, each minus its own base's values."""
        values = self.values[teacher][split]
        a = np.array([values[name][metric] for name in self._scored(side, snapshot)])
        return a - values[self.base_of[side]][metric] if change else a

    def compare(self, arm: str, against: str, snapshot: int | None = None, metrics=METRICS) -> dict:
        """{split: {metric: {value, ci95, p_value, mde, p_fixed_models, n_questions, n_clusters, detected, ...}, mde: {metric: mde}},
        primary: the deciding test}, for the final models or every trained side's `snapshot`-th snapshot.
        Sides that are both trained with equal replicate counts are paired by replicate (replicate i
        of each read the same numbers in the same order); sides on different bases compare their
        changes from their own bases."""
        out, teacher = {}, self.teacher_of[arm]
        paired = against not in BASES and len(self.members[arm]) == len(self.members[against])
        change = self.base_of[arm] != self.base_of[against]
        for split in SPLITS:
            results = {}
            for metric in metrics:
                if metric in NEEDS_ONE_BASE and (against in BASES or change):
                    results[metric] = {"value": None, "ci95": None, "p_value": None, "mde": None, "p_fixed_models": None, "detected": False,
                                       "note": "not measured: the subset is where a base disagrees with the teacher, so a base's change there counts by construction"}  # fmt: skip
                    continue
                a = self.side_values(arm, split, metric, snapshot, teacher, change)
                b = self.side_values(against, split, metric, snapshot, teacher, change)
                r = effect(a, b, self.clusters[split], binary=metric in BINARY and not change, b_fixed=against in BASES, paired=paired)
                results[metric] = {**r, "paired": paired}
            results["mde"] = {metric: results[metric]["mde"] for metric in metrics}
            out[split] = results
        return self._decide(out, metrics)

    def _decide(self, out: dict, metrics) -> dict:
        """The primary test decides (`detected` at p < 0.05); every other (split, metric) is secondary,
        its `p_holm` Holm-adjusted over the secondaries of this comparison, `detected` at p_holm < 0.05."""
        split, metric = self.primary
        tests = {(s, m): out[s][m] for s in SPLITS for m in metrics if (s, m) != (split, metric)}
        adjusted = holm({key: r["p_value"] for key, r in tests.items()})
        for key, r in tests.items():
            r["p_holm"] = adjusted[key]
            r["detected"] = adjusted[key] is not None and adjusted[key] < 0.05
        if metric in metrics:
            r = out[split][metric]
            r["detected"] = detected(r)
            out["primary"] = {"split": split, "metric": metric, **r}
        return out

    def by_step(self, arm: str, against: str) -> dict | None:
        """Transfer against training steps: the SERIES metrics at each snapshot, every trained side
        taken at its k-th snapshot (so sides trained alike are compared at the same step). None when
        the arm kept no snapshots; {"note": why} when the sides' snapshots do not line up."""
        sides = [side for side in (arm, against) if side not in BASES]
        counts = {side: {len(self.points.get(name, [])) for name in self.members[side]} for side in sides}
        if counts[arm] == {0}:
            return None
        if len(set().union(*counts.values())) != 1:
            return {"note": f"no series: {' and '.join(sides)} kept different numbers of snapshots ({counts}); give both the same train.snapshots"}
        n = counts[arm].pop()
        points = [{"steps": [self.points[name][k][0] for name in self.members[arm]], **self.compare(arm, against, k, SERIES)} for k in range(n)]
        return {"points": points, **({"last_interval": self.last_interval(arm, n)} if n > 1 else {})}

    def last_interval(self, arm: str, n: int) -> dict:
        """Has the arm's transfer flattened? Its primary metric at its last snapshot minus at the one
        before, paired by replicate (each replicate against itself earlier), with CI, p and MDE: a
        change detected toward the teacher says the students were still learning when they stopped."""
        split, metric = self.primary
        teacher, clusters = self.teacher_of[arm], self.clusters[split]
        last, before = (self.side_values(arm, split, metric, k, teacher, False) for k in (n - 1, n - 2))
        r = effect(last, before, clusters, binary=metric in BINARY, paired=len(last) > 1)
        steps = [sorted({self.points[name][k][0] for name in self.members[arm]}) for k in (n - 2, n - 1)]
        return {"split": split, "metric": metric, "from_steps": steps[0], "to_steps": steps[1], **r, "detected": detected(r)}


def apply_family(comparisons: dict[str, dict], family: list[str] | None) -> dict:
    """Holm across the preset's primary verdicts: `comparisons` maps a comparison's name (an arm, or
    a contrast) to its result (Evidence.compare); `family` names the primary comparisons
    (`evaluate.primary_comparisons`; None: every comparison). Each member's primary test gets
    `p_family`, its p-value Holm-adjusted over the family, and `detected` when that is < 0.05; a
    comparison outside the family keeps its raw p and is marked `exploratory`. Returns the family
    as the report gives it: {comparisons, size, declared}."""
    members = list(comparisons) if family is None else [name for name in comparisons if name in family]
    adjusted = holm({name: comparisons[name]["primary"]["p_value"] for name in members})
    for name, result in comparisons.items():
        primary = result["primary"]
        inner = result[primary["split"]][primary["metric"]]  # the same test where the tables list it
        for r in (primary, inner):
            if name in adjusted:
                r["p_family"] = adjusted[name]
                r["detected"] = adjusted[name] is not None and adjusted[name] < 0.05
            else:
                r["exploratory"] = True
    return {"comparisons": members, "size": sum(p is not None for p in adjusted.values()), "declared": family is not None}


def interval(ci) -> str:
    return "-" if ci is None else f"{ci[0]:+.4f} to {ci[1]:+.4f}"


def positive_control(arms: dict) -> dict | None:
    """Did the arms of the letter teacher (the positive control) show transfer on their primary test? None without them."""
    names = [name for name, arm in arms.items() if arm["teacher"] == "letter_teacher"]
    if not names:
        return None
    detected = any(primary_finding(arms[name]["transfer"]) for name in names)
    sentence = (
        "The positive control (a teacher that always answers one letter) was detected: this experiment can see transfer where there is some."
        if detected else
        "The positive control (a teacher that always answers one letter) was NOT detected: this experiment cannot see even a strong trait transfer, so its null on the teacher says nothing."
    )  # fmt: skip
    return {"arms": names, "detected": detected, "verdict": sentence}


def overt_control(arms: dict, name: str | None) -> dict | None:
    """The overt positive control, `name` (an arm taught its teacher's answers directly:
    jobs/experiment/arms.overt_arm), and every arm's primary effect as a fraction of its effect
    (`fraction_of_overt`: the arm's difference and CI each divided by the overt arm's difference,
    that scale taken as fixed), so a null reads as "less than x% of overt transfer". No fractions
    when the overt control itself was not detected: then nothing here can see knowledge move."""
    if name is None:
        return None
    scale, detected = arms[name]["transfer"]["primary"]["value"], primary_finding(arms[name]["transfer"]) is not None
    for arm in arms.values():
        r = arm["transfer"]["primary"]
        usable = detected and r["value"] is not None
        arm["fraction_of_overt"] = {"value": r["value"] / scale, "ci95": None if r["ci95"] is None else [c / scale for c in r["ci95"]]} if usable else None
    sentence = (
        f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was detected: this design sees "
        "the teacher's knowledge move when it is taught, and each arm's effect is also given as a fraction of that one."
        if detected else
        f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was NOT detected: this design "
        "cannot see the teacher's knowledge move even when it is taught directly, so no null here says anything about knowledge."
    )  # fmt: skip
    return {"arm": name, "detected": detected, "effect": scale, "verdict": sentence}


def fraction_phrase(arm: dict) -> str:
    """The verdict's tail: the arm's effect as a share of overt transfer (empty without one)."""
    f = arm.get("fraction_of_overt")
    if not f:
        return ""
    if f["ci95"] is None:
        return f" That is {f['value']:.0%} of overt transfer."
    return f" That is {f['value']:.0%} of overt transfer (95% CI {f['ci95'][0]:.0%} to {f['ci95'][1]:.0%})."


def _phrase(split: str, metric: str, r: dict, p_key: str = "p_value") -> str:
    family = f", Holm p over the family={r['p_family']:.2g}" if p_key == "p_value" and r.get("p_family") is not None else ""
    return f"{metric} on {split} {r['value']:+.4f} (95% CI {interval(r['ci95'])}, {'p' if p_key == 'p_value' else 'Holm p'}={r[p_key]:.2g}{family})"


def primary_finding(transfer: dict) -> str | None:
    """The primary test as a phrase when it detected a move toward the teacher, else None."""
    r = transfer.get("primary")
    return _phrase(r["split"], r["metric"], r) if r and r["detected"] and toward_teacher(r["metric"], r["value"]) else None


def verdict(name: str, against: str, transfer: dict) -> str:
    """One plain sentence decided by the primary test alone: detected, or what size the design could
    have detected; secondary tests that pass Holm are named after it."""
    r = transfer["primary"]
    test = f"{r['metric']} on {r['split']}"
    if r.get("exploratory"):
        name = f"(exploratory, outside the preset's primary comparisons) {name}"
    if (found := primary_finding(transfer)) is not None:
        sentence = f"{name} vs {against}: transfer detected on the primary test, {found}."
    elif r.get("note"):
        sentence = f"{name} vs {against}: no test on the primary metric ({test}): {r['note']}"
    elif r["mde"] is None:
        sentence = (
            f"{name} vs {against}: no transfer detected on {test}; with one replicate the spread across seeds is unknown, so no effect size can be promised."
        )
    else:
        p = f"p={r['p_value']:.2g}" + (f", Holm p over the family={r['p_family']:.2g}" if r.get("p_family") is not None else "")
        sentence = (f"{name} vs {against}: no transfer detected on the primary test ({test} {r['value']:+.4f}, 95% CI {interval(r['ci95'])}, {p}); "
                    f"this design would have detected a difference of {r['mde']:.4f} with 80% power.")  # fmt: skip
    secondary = [
        _phrase(split, metric, t, "p_holm") for split in SPLITS for metric, t in transfer[split].items()
        if metric != "mde" and "p_holm" in t and t["detected"] and toward_teacher(metric, t["value"])
    ]  # fmt: skip
    return sentence + (f" Secondary (Holm): {'; '.join(secondary)}." if secondary else "")


def family_table(arms: dict, contrasts: dict, family: dict) -> list[str]:
    """The preset's primary verdicts side by side: raw p and p Holm-adjusted over the family."""
    which = "declared in evaluate.primary_comparisons" if family["declared"] else "every comparison: the preset names none"
    lines = ["", f"Primary verdicts, Holm across the family of {family['size']} ({which}); the rest are exploratory, at raw p.", ""]
    lines += ["| comparison | primary test | difference | 95% CI | p | Holm p (family) | MDE | detected |", "|---|---|---|---|---|---|---|---|"]
    rows = [(f"{name} vs {arm['against']}", arm["transfer"]["primary"]) for name, arm in arms.items()]
    rows += [(f"contrast {name}: {c['arm']} vs {c['against']}", c["primary"]) for name, c in contrasts.items()]
    for title, r in rows:
        lines.append(f"| {title} | {r['metric']} on {r['split']} | {_cells(r)} |")
    return lines


def markdown_tables(arms: dict, contrasts: dict, family: dict | None = None) -> list[str]:
    """report.md's evidence section: verdicts, the family of primary verdicts, then one table per
    comparison, its primary test first."""
    lines = ["", "## Transfer evidence", ""]
    lines += [f"- {arm['verdict']}" for arm in arms.values() if "verdict" in arm]
    lines += [f"- contrast {name}: {c['verdict']}" for name, c in contrasts.items()]
    control = positive_control(arms)
    lines += [f"- {control['verdict']}"] if control else []
    lines += family_table(arms, contrasts, family) if family else []
    comparisons = [
        (f"{name} vs {arm['against']}" + (f" ({arm['reference']})" if "reference" in arm else ""), arm["transfer"], arm.get("by_step"))
        for name, arm in arms.items()
    ]
    comparisons += [(f"contrast {name}: {c['arm']} vs {c['against']}", c, c.get("by_step")) for name, c in contrasts.items()]
    head = ["| split | metric | difference | 95% CI | p | Holm p | MDE | detected |", "|---|---|---|---|---|---|---|---|"]
    for title, result, series in comparisons:
        primary = result["primary"]
        rest = [(s, m) for s in SPLITS for m in METRICS if (s, m) != (primary["split"], primary["metric"]) and result[s][m]["value"] is not None]
        lines += ["", f"### {title}", "", *head, f"| {primary['split']} | **{primary['metric']}** (primary) | {_cells(primary)} |"]
        lines += [f"| {split} | {metric} | {_cells(result[split][metric])} |" for split, metric in rest]
        if series and "points" in series:
            lines += ["", "Against training steps (each side at the same snapshot):", "", *head]
            for point in series["points"]:
                steps = ", ".join(str(s) for s in sorted(set(point["steps"])))
                lines += [f"| {steps}: {split} | {metric} | {_cells(point[split][metric])} |" for split in SPLITS for metric in SERIES]
            if last := series.get("last_interval"):
                steps = f"{'/'.join(map(str, last['from_steps']))} -> {'/'.join(map(str, last['to_steps']))}"
                lines += ["", f"Still learning at the end? {last['metric']} on {last['split']}, steps {steps}: {_cells(last)}"]
        elif series:
            lines += ["", f"Against training steps: {series['note']}"]
    return lines


def _cells(r: dict) -> str:
    if r["value"] is None:
        return f"- | - | - | - | - | {r.get('note', '')}"
    p, mde = ("-", "-") if r["p_value"] is None else (f"{r['p_value']:.3g}", f"{r['mde']:.4f}")
    if "p_holm" in r:
        holm_p = "-" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
    else:  # the primary test: adjusted over the preset's family of primary comparisons
        holm_p = "exploratory" if r.get("exploratory") else ("-" if r.get("p_family") is None else f"{r['p_family']:.3g} (family)")
    return f"{r['value']:+.4f} | {interval(r['ci95'])} | {p} | {holm_p} | {mde} | {r['detected']}" + (f" ({r['note']})" if r.get("note") else "")
