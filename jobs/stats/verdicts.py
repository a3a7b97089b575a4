"""The verdicts in words: one sentence per comparison, and the positive controls'.

jobs/stats/evidence.py computes every comparison; this module says what they show: the primary
test's phrase and the verdict it decides (detected toward the teacher, or the difference the design
could have detected), the overt and letter positive controls' sentences and each arm's fraction of
overt transfer. report.md's tables of them are jobs/reporting/markdown.py's.
"""

from __future__ import annotations

from jobs.stats.evidence import SPLITS, Evidence, toward_teacher
from jobs.stats.results import Changed, Comparison, Fraction, OvertControl, PositiveControl, Primary, Result

# What the base did not know, read one way for every arm, fixed before any data: the rank of the teacher's
# pick on the train questions where it differs from the base's, crossed where the placebo teacher was
# scored (drift common to both teachers cancels), else toward the teacher; against the arm's reference.
CHANGED = ("train", "teacher_answer_rank_changed")


def interval(ci) -> str:
    return "-" if ci is None else f"{ci[0]:+.4f} to {ci[1]:+.4f}"


def positive_control(teachers: dict[str, str], transfers: dict[str, Comparison]) -> PositiveControl | None:
    """Did the arms of the letter teacher (the positive control) show transfer on their primary test?
    `teachers`: each arm's teacher; `transfers`: each arm's comparison. None without such arms."""
    names = [name for name, teacher in teachers.items() if teacher == "letter_teacher"]
    if not names:
        return None
    detected = any(primary_finding(transfers[name]) for name in names)
    sentence = (
        "The positive control (a teacher that always answers one letter) was detected: this experiment can see transfer where there is some."
        if detected
        else "The positive control (a teacher that always answers one letter) was NOT detected: this experiment cannot see even a strong trait transfer, so its null on the teacher says nothing."
    )
    return PositiveControl(arms=names, detected=detected, verdict=sentence)


def overt_control(
    transfers: dict[str, Comparison], against: dict[str, str], name: str | None, ev: Evidence
) -> tuple[OvertControl | None, dict[str, Fraction | None]]:
    """The overt positive control, `name` (an arm taught its teacher's answers directly:
    jobs/experiment/cast.overt_arm), and every arm's effect as a fraction of its effect
    (`fraction_of_overt`: Evidence.fraction_of, held out, with Fieller's interval), so a null reads
    as "less than x% of overt transfer" at what the data allow. `transfers` and `against`: each
    arm's comparison and what it is measured against. Returns (the control, {arm: fraction});
    (None, {}) without an overt control, and every fraction None when the overt control itself was
    not detected: then nothing here can see knowledge move."""
    if name is None:
        return None, {}
    scale, detected = transfers[name].primary.value, primary_finding(transfers[name]) is not None
    fractions = {arm: ev.fraction_of(arm, against[arm], name, against[name]) if detected else None for arm in transfers}
    sentence = (
        f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was detected: this design sees "
        "the teacher's knowledge move when it is taught, and each arm's held-out effect is also given as a fraction of its held-out effect."
        if detected
        else f"The overt positive control ({name}: taught the teacher's own answers to its train questions) was NOT detected: this design "
        "cannot see the teacher's knowledge move even when it is taught directly, so no null here says anything about knowledge."
    )
    return OvertControl(arm=name, detected=detected, effect=scale, verdict=sentence), fractions


def fraction_phrase(f: Fraction | None) -> str:
    """The verdict's tail: an arm's held-out effect as a share of overt transfer (empty without one)."""
    if f is None or f.value is None:
        return ""
    where = f" on held-out {f.metric}"
    if f.ci95 is None:
        return f" That is {f.value:.0%} of overt transfer{where} (no interval)."
    low, high = ("unbounded" if c is None else f"{c:.0%}" for c in f.ci95)
    return f" That is {f.value:.0%} of overt transfer{where} (95% CI {low} to {high}, Fieller, the overt effect's uncertainty included)."


def describe_test(split: str, metric: str, direction: str = "toward_teacher") -> str:
    return f"{metric} on {split}" + (
        " (crossed: toward the teacher's picks and away from the sham's)" if direction == "crossed" else ""
    )


def _phrase(split: str, metric: str, r: Result, holm_p: bool = False) -> str:
    """A test's value, CI and p (or, for a secondary, its Holm p) in words."""
    family = f", Holm p over the family={r.p_family:.2g}" if not holm_p and r.p_family is not None else ""
    name = describe_test(split, metric, r.direction if isinstance(r, Primary) else "toward_teacher")
    return f"{name} {r.value:+.4f} (95% CI {interval(r.ci95)}, {'Holm p' if holm_p else 'p'}={r.p_holm if holm_p else r.p_value:.2g}{family})"


def primary_finding(transfer: Comparison) -> str | None:
    """The primary test as a phrase when it detected a move toward the teacher, else None."""
    r = transfer.primary
    return _phrase(r.split, r.metric, r) if r.detected and toward_teacher(r.metric, r.value) else None


def verdict(name: str, against: str, transfer: Comparison) -> str:
    """One plain sentence decided by the primary test alone: detected, or what size the design could
    have detected; secondary tests that pass Holm are named after it."""
    r = transfer.primary
    test = describe_test(r.split, r.metric, r.direction)
    if r.exploratory:
        name = f"(exploratory, outside the preset's primary comparisons) {name}"
    if (found := primary_finding(transfer)) is not None:
        sentence = f"{name} vs {against}: transfer detected on the primary test, {found}."
    elif r.note:
        sentence = f"{name} vs {against}: no test on the primary metric ({test}): {r.note}"
    elif r.mde is None:
        sentence = f"{name} vs {against}: no transfer detected on {test}; with one replicate the spread across seeds is unknown, so no effect size can be promised."
    else:
        p = f"p={r.p_value:.2g}" + (f", Holm p over the family={r.p_family:.2g}" if r.p_family is not None else "")
        sentence = (
            f"{name} vs {against}: no transfer detected on the primary test ({test} {r.value:+.4f}, 95% CI {interval(r.ci95)}, {p}); "
            f"this design would have detected a difference of {r.mde:.4f} with 80% power."
        )
    secondary = [
        _phrase(split, metric, t, holm_p=True)
        for split in SPLITS
        for metric, t in transfer.split(split).metrics.items()
        if t.p_holm is not None and t.detected and toward_teacher(metric, t.value)
    ]
    return sentence + (f" Secondary (Holm): {'; '.join(secondary)}." if secondary else "")


def _reading(comparison: Comparison | None, split: str, metric: str) -> tuple[str, Result] | None:
    """(direction, result) of one reading: crossed where the comparison has it, else toward the teacher."""
    if comparison is None:
        return None
    crossed = comparison.directions.crossed if comparison.directions is not None else None
    if crossed is not None and metric in crossed.get(split, {}):
        return "crossed", crossed[split][metric]
    return "toward_teacher", comparison.cell(split, metric)


def changed(name: str, against: str, transfer: Comparison, against_base: Comparison | None, base: str) -> Changed:
    """Does arm `name` learn what its teacher knows that the base does not? The CHANGED reading
    against its reference decides: detected toward the teacher at raw p < 0.05 (where that reading
    is the preset's primary, the primary's own decision, Holm over the family included); the same
    reading against the base (`against_base`, where the reference is another arm) stands beside it."""
    split, metric = CHANGED
    direction, result = _reading(transfer, split, metric)
    primary = transfer.primary
    if (primary.split, primary.metric, primary.direction) == (split, metric, direction):
        result = Result.model_validate(
            {k: v for k, v in primary.given().items() if k not in ("split", "metric", "direction")}
        )
        learns = bool(primary.detected) and toward_teacher(metric, primary.value)
    else:
        learns = result.p_value is not None and result.p_value < 0.05 and toward_teacher(metric, result.value)
    base_reading = _reading(against_base, split, metric)
    beside = base_reading[1] if base_reading is not None and base_reading[0] == direction else None
    test = f"{metric} on {split}" + (", crossed" if direction == "crossed" else "")
    if result.value is None:
        sentence = f"{name}: whether it learns what its teacher knows that the base does not is not measured against {against} ({result.note})."
    else:
        found = (
            f"{result.value:+.4f} (95% CI {interval(result.ci95)}, p={result.p_value:.2g})"
            if result.p_value is not None
            else f"{result.value:+.4f} (no test)"
        )
        answer = (
            "yes"
            if learns
            else "not detected" + (f"; the design would have detected {result.mde:.4f}" if result.mde else "")
        )
        sentence = (
            f"{name} learns what its teacher knows that the base does not: {answer} ({test}, vs {against} {found}"
        )
        if beside is not None and beside.value is not None:
            sentence += f"; vs {base} {beside.value:+.4f}" + (
                f", 95% CI {interval(beside.ci95)}" if beside.ci95 else ""
            )
        sentence += ")."
    return Changed(
        split=split,
        metric=metric,
        direction=direction,
        result=result,
        against_base=beside,
        learns=learns,
        sentence=sentence,
    )
