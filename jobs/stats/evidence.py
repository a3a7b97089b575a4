"""Evidence of transfer for the report: each arm against its reference, and the declared contrasts.

For both splits (`train`: the teacher's own training questions, where the
subliminal-learning theory predicts the student moves first; `held_out`) and
every metric of jobs/stats/transfer_stats.py, the paired difference with its CI,
p-value and MDE. An arm is compared with its reference (`arms.<name>.against`:
the control arm for sft arms on the teacher's numbers, else the base model); a
contrast compares two arms (e.g. same-init against other-init). Both hold the
replicates' spread (jobs/stats/transfer_stats.py). Where a sham teacher was scored,
every comparison is also read toward its picks and crossed (`Evidence.directions`).
The verdicts in words are jobs/stats/verdicts.py's.
"""

from __future__ import annotations

import numpy as np

from jobs.stats.results import ByStep, Comparison, Family, Fraction, LastInterval, Result
from jobs.stats.transfer_stats import (
    BINARY,
    LOWER_IS_TRANSFER,
    METRICS,
    choice_entropy,
    cluster_ids,
    detected,
    effect,
    fitted_temperature,
    holm,
    question_metrics,
)

SPLITS = ("train", "held_out")
SERIES = ("agreement", "teacher_answer_rank", "teacher_answer_logprob")  # followed against training steps and plotted
BASES = ("base", "other_base")  # the scored base models (jobs/experiment/arms.OTHER_BASE is the second)
# Metrics on the `changed` questions, where the teacher's pick differs from the base's: what the base did not know.
NEEDS_ONE_BASE = {"agreement_changed", "teacher_answer_rank_changed"}
# The metrics read toward either teacher's picks, side by side for every comparison (`directions`).
SIDE_BY_SIDE = (
    "teacher_answer_rank",
    "teacher_answer_logprob",
    "teacher_answer_logprob_calibrated",
    "agreement",
    "teacher_answer_rank_changed",
    "agreement_changed",
)
# Why a `changed` metric has no test in some readings (`_compare`, `directions`).
SELECTED_BY_BASE = "not measured: the subset is where the base disagrees with this teacher, so any model's drift from the base counts there by construction"
SUBSETS_DIFFER = "not measured: the sides stand on different bases, whose `changed` subsets differ"
# a teacher and its placebo: the sham (jobs/experiment/rows_kinds.SHAM)
PAIRS = {"teacher": "sham_teacher", "sham_teacher": "teacher"}


def not_measured(note: str) -> Result:
    """A reading with no test, and why."""
    return Result.model_validate(
        {
            "value": None,
            "ci95": None,
            "p_value": None,
            "mde": None,
            "p_fixed_models": None,
            "detected": False,
            "note": note,
        }
    )


def changed_refusal(metric: str, against: str, change: bool, crossed: bool = False) -> str | None:
    """Why a `changed` metric has no test in this reading, or None: across bases never; against a
    base only crossed (both subsets chosen alike by the base's picks)."""
    if metric not in NEEDS_ONE_BASE:
        return None
    if change:
        return SUBSETS_DIFFER
    return SELECTED_BY_BASE if against in BASES and not crossed else None


def toward_teacher(metric: str, value: float) -> bool:
    return value < 0 if metric in LOWER_IS_TRANSFER else value > 0


class Evidence:
    """Per-question metric values of every scored model, per split, and the comparisons.

    `scores` holds every scored name: the bases, the teachers, the arm models and their snapshots;
    `models` the arm models (each with `arm`, `name`, `teacher`, `base`: jobs/experiment/arms.ArmModel);
    `points[model]` lists an arm model's (step, scored name) snapshots (jobs/experiment/cast.snapshot_points).
    Every model's metrics are taken against its own base (teacher_answer_logprob: its log p of the
    teacher's answer minus its base's), so arms on different bases compare changes, not levels.
    `primary` = (split, metric): the one test that decides each comparison; `direction` which reading
    of it (toward the teacher's picks, or crossed: `directions`).
    `temperatures[name]`: each scored model's temperature fitted on the known split (none without one).
    """

    def __init__(
        self,
        scores: dict[str, list[dict]],
        models: list,
        primary: tuple[str, str],
        points: dict | None = None,
        direction: str = "toward_teacher",
    ):
        self.primary, self.points, self.direction = primary, points or {}, direction
        self.members, self.teacher_of, self.base_of = {b: [b] for b in BASES if b in scores}, {}, {b: b for b in BASES}
        for m in models:
            self.members.setdefault(m.arm, []).append(m.name)
            self.teacher_of[m.arm] = m.teacher
            self.base_of[m.arm] = m.base
        # a snapshot `<model>@<step>` is on its model's base; teachers on base
        model_base = {m.name: m.base for m in models}
        own_base = {name: name if name in BASES else model_base.get(name.split("@")[0], "base") for name in scores}
        known = {name: [r for r in scored if r["split"] == "known"] for name, scored in scores.items()}
        self.temperatures = {name: fitted_temperature(rows) for name, rows in known.items() if rows}
        self.entropy = {
            name: {split: choice_entropy([r for r in scored if r["split"] == split]) for split in (*SPLITS, "known")}
            for name, scored in scores.items()
        }

        def with_base(name):  # the model's fitted temperature and its base's, or None
            pair = (self.temperatures.get(name), self.temperatures.get(own_base[name]))
            return None if None in pair else pair

        # values[teacher][split][model]: metrics against that teacher and its own base
        self.values, self.clusters = {}, {}
        teachers = set(self.teacher_of.values())
        # each teacher's placebo, where scored
        teachers |= {PAIRS[t] for t in teachers if t in PAIRS and PAIRS[t] in scores}
        for split in SPLITS:
            rows = {name: [r for r in scored if r["split"] == split] for name, scored in scores.items()}
            for teacher in teachers:
                self.values.setdefault(teacher, {})[split] = {
                    name: question_metrics(r, rows[teacher], rows[own_base[name]], with_base(name))
                    for name, r in rows.items()
                }
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

    def compare(self, arm: str, against: str, snapshot: int | None = None, metrics=METRICS) -> Comparison:
        """The arm against its reference (jobs/stats/results.Comparison): {split: {metric: {value, ci95, p_value, mde, p_fixed_models, n_questions, n_clusters, detected, ...}, mde: {metric: mde}},
        primary: the deciding test}, for the final models or every trained side's `snapshot`-th snapshot.
        Sides that are both trained with equal replicate counts are paired by replicate (replicate i
        of each read the same numbers in the same order); sides on different bases compare their
        changes from their own bases."""
        return Comparison.model_validate(self._compare(arm, against, snapshot, metrics))

    def _compare(self, arm: str, against: str, snapshot: int | None, metrics) -> dict:
        out, teacher = {}, self.teacher_of[arm]
        paired = against not in BASES and len(self.members[arm]) == len(self.members[against])
        change = self.base_of[arm] != self.base_of[against]
        for split in SPLITS:
            results = {}
            for metric in metrics:
                if (why := changed_refusal(metric, against, change)) is not None:
                    results[metric] = not_measured(why)
                    continue
                a = self.side_values(arm, split, metric, snapshot, teacher, change)
                b = self.side_values(against, split, metric, snapshot, teacher, change)
                r = effect(
                    a,
                    b,
                    self.clusters[split],
                    binary=metric in BINARY and not change,
                    b_fixed=against in BASES,
                    paired=paired,
                )
                results[metric] = r.with_(paired=paired)
            results["mde"] = {metric: results[metric].mde for metric in metrics}
            out[split] = results
        if (placebo := self.placebo_of(arm)) is not None:
            out["directions"] = self.directions(
                arm, against, snapshot, placebo, [m for m in SIDE_BY_SIDE if m in metrics]
            )
        return self._decide(out, metrics)

    def placebo_of(self, arm: str) -> str | None:
        """The teacher whose picks are the placebo direction for an arm: the sham for an arm of the
        teacher and the teacher for an arm of the sham, where both were scored; else None."""
        other = PAIRS.get(self.teacher_of[arm])
        return other if other in self.values else None

    def lean(self, side: str, split: str, metric: str, snapshot: int | None, placebo: str, change: bool) -> np.ndarray:
        """[replicates x questions] of half the side's metric toward its teacher's picks minus toward
        the placebo's: the crossed effect of two sides is the difference of their leans. On a
        question where the two teachers pick the same choice it is 0 for every model."""
        own = PAIRS[placebo]
        return (
            self.side_values(side, split, metric, snapshot, own, change)
            - self.side_values(side, split, metric, snapshot, placebo, change)
        ) / 2

    def directions(self, arm: str, against: str, snapshot: int | None, placebo: str, metrics) -> dict:
        """{toward_placebo, crossed}: {split: {metric: effect}}. With x_M^P model M's metric toward
        teacher P's picks, A the arm and B its reference: toward the placebo's picks B minus A,
        x_B^P' - x_A^P' (on the sham's numbers, B should move toward the sham's picks if anything
        rides the numbers); crossed 1/2[(x_A^P - x_B^P) + (x_B^P' - x_A^P')], the mean of the two
        directions, in which drift common to both teachers cancels (docs/report.md). Paired and
        fixed as `compare`. A `changed` metric against a base is read crossed only: its two subsets
        (each teacher's picks the base did not make) are chosen alike, so drift from the base raises
        both readings alike, as far as the base ranks the two teachers' picks alike (the sham's
        draw is balanced on it: jobs/sources/sham_draw.py); toward one teacher it counts by
        construction."""
        paired = against not in BASES and len(self.members[arm]) == len(self.members[against])
        change = self.base_of[arm] != self.base_of[against]
        out: dict = {"placebo": placebo, "toward_placebo": {}, "crossed": {}}
        for split in SPLITS:
            out["toward_placebo"][split], out["crossed"][split] = {}, {}
            for metric in metrics:
                options = {"binary": metric in BINARY and not change, "b_fixed": against in BASES, "paired": paired}
                if (why := changed_refusal(metric, against, change)) is not None:
                    out["toward_placebo"][split][metric] = not_measured(why)
                else:
                    a, b = (self.side_values(side, split, metric, snapshot, placebo, change) for side in (arm, against))
                    r = effect(-a, -b, self.clusters[split], **options)  # B - A as (-A) - (-B): `b_fixed` stays on B
                    out["toward_placebo"][split][metric] = r.with_(paired=paired)
                if (why := changed_refusal(metric, against, change, crossed=True)) is not None:
                    out["crossed"][split][metric] = not_measured(why)
                else:
                    a, b = (self.lean(side, split, metric, snapshot, placebo, change) for side in (arm, against))
                    out["crossed"][split][metric] = effect(a, b, self.clusters[split], **options).with_(paired=paired)
        return out

    def differences(self, arm: str, against: str, split: str, metric: str) -> np.ndarray | None:
        """[replicates x questions]: each of the arm's replicates minus its reference's (the same
        replicate, or the fixed base), in the primary direction (crossed: the leans); None when two
        trained sides have unequal replicate counts (no replicate-by-replicate difference)."""
        change, placebo = self.base_of[arm] != self.base_of[against], self.placebo_of(arm)
        if self.direction == "crossed" and placebo is not None:
            a, b = (self.lean(side, split, metric, None, placebo, change) for side in (arm, against))
        else:
            a, b = (
                self.side_values(side, split, metric, None, self.teacher_of[arm], change) for side in (arm, against)
            )
        return a - b if against in BASES or len(a) == len(b) else None

    def fraction_of(self, arm: str, against: str, overt: str, overt_against: str) -> Fraction | None:
        """The arm's effect as a fraction of the overt control's, both on held-out questions (the
        overt control is taught the train questions) on the primary metric and direction, with
        Fieller's interval by test inversion (jobs/stats/share.ratio_interval), the overt effect's
        own uncertainty included: the two are independent groups of replicates. None when either
        side has no replicate-by-replicate difference."""
        from jobs.stats.share import ratio_interval

        split, metric = "held_out", self.primary[1]
        num, den = self.differences(arm, against, split, metric), self.differences(overt, overt_against, split, metric)
        if num is None or den is None:
            return None
        ratio = ratio_interval(num, den, self.clusters[split], paired=False)
        return Fraction.model_validate({"split": split, "metric": metric, "direction": self.direction, **ratio.dump()})

    def _decide(self, out: dict, metrics) -> dict:
        """The primary test decides (`detected` at p < 0.05); every other (split, metric) toward the
        teacher is secondary, its `p_holm` Holm-adjusted over the secondaries of this comparison,
        `detected` at p_holm < 0.05. A crossed primary is read from `directions`, or has no test
        (a `note` says why) where no placebo teacher was scored."""
        split, metric = self.primary
        crossed = self.direction == "crossed"
        tests = {(s, m): out[s][m] for s in SPLITS for m in metrics if crossed or (s, m) != (split, metric)}
        adjusted = holm({key: r.p_value for key, r in tests.items()})
        for (s, m), r in tests.items():
            out[s][m] = r.with_(p_holm=adjusted[s, m], detected=adjusted[s, m] is not None and adjusted[s, m] < 0.05)
        if metric in metrics:
            if not crossed:
                table = out[split]
            elif "directions" in out:
                table = out["directions"]["crossed"][split]
            else:
                table = {
                    metric: Result.model_validate(
                        {
                            "value": None,
                            "ci95": None,
                            "p_value": None,
                            "mde": None,
                            "p_fixed_models": None,
                            "paired": False,
                            "note": "no crossed effect: the arm learns from no teacher whose placebo (the sham, or the teacher) was scored",
                        }
                    )
                }
            # the primary, where the tables list it
            table[metric] = table[metric].with_(detected=detected(table[metric]))
            out["primary"] = {"split": split, "metric": metric, "direction": self.direction, **table[metric].given()}
        return out

    def by_step(self, arm: str, against: str) -> ByStep | None:
        """Transfer against training steps: the SERIES metrics at each snapshot, every trained side
        taken at its k-th snapshot (so sides trained alike are compared at the same step). None when
        the arm kept no snapshots; {"note": why} when the sides' snapshots do not line up."""
        sides = [side for side in (arm, against) if side not in BASES]
        counts = {side: {len(self.points.get(name, [])) for name in self.members[side]} for side in sides}
        if counts[arm] == {0}:
            return None
        if len(set().union(*counts.values())) != 1:
            return ByStep(
                note=f"no series: {' and '.join(sides)} kept different numbers of snapshots ({counts}); give both the same train.snapshots"
            )
        n = counts[arm].pop()
        points = [
            {"steps": [self.points[name][k][0] for name in self.members[arm]], **self._compare(arm, against, k, SERIES)}
            for k in range(n)
        ]
        return ByStep.model_validate(
            {"points": points, **({"last_interval": self.last_interval(arm, n)} if n > 1 else {})}
        )

    def last_interval(self, arm: str, n: int) -> LastInterval:
        """Has the arm's transfer flattened? Its primary metric at its last snapshot minus at the one
        before, paired by replicate (each replicate against itself earlier), with CI, p and MDE: a
        change detected toward the teacher says the students were still learning when they stopped."""
        split, metric = self.primary
        teacher, clusters, placebo = self.teacher_of[arm], self.clusters[split], self.placebo_of(arm)
        if self.direction == "crossed" and placebo is not None:
            last, before = (self.lean(arm, split, metric, k, placebo, False) for k in (n - 1, n - 2))
        else:
            last, before = (self.side_values(arm, split, metric, k, teacher, False) for k in (n - 1, n - 2))
        r = effect(last, before, clusters, binary=metric in BINARY, paired=len(last) > 1)
        steps = [sorted({self.points[name][k][0] for name in self.members[arm]}) for k in (n - 2, n - 1)]
        head = {
            "split": split,
            "metric": metric,
            "direction": self.direction,
            "from_steps": steps[0],
            "to_steps": steps[1],
        }
        return LastInterval.model_validate({**head, **r.given(), "detected": detected(r)})


def apply_family(comparisons: dict[str, Comparison], family: list[str] | None) -> tuple[Family, dict[str, Comparison]]:
    """Holm across the preset's primary verdicts: `comparisons` maps a comparison's name (an arm, or
    a contrast) to its result (Evidence.compare); `family` names the primary comparisons
    (`evaluate.primary_comparisons`; None: every comparison). Returns the family as the report gives
    it ({comparisons, size, declared}) and every comparison anew: a member's primary test (in its own
    field and where the tables list it) with `p_family`, its p-value Holm-adjusted over the family,
    and `detected` when that is < 0.05; a comparison outside the family keeps its raw p and is
    marked `exploratory`."""
    members = list(comparisons) if family is None else [name for name in comparisons if name in family]
    adjusted = holm({name: comparisons[name].primary.p_value for name in members})
    decided = {}
    for name, result in comparisons.items():
        if name in adjusted:
            p = adjusted[name]
            decided[name] = result.with_primary(p_family=p, detected=p is not None and p < 0.05)
        else:
            decided[name] = result.with_primary(exploratory=True)
    return Family(
        comparisons=members, size=sum(p is not None for p in adjusted.values()), declared=family is not None
    ), decided
