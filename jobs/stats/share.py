"""Where the signal rides: how much of the student's effect an arm keeps when the teacher's most
divergent tokens are masked, replaced, or the numbers decoded greedily.

An arm's *share remaining* is a ratio of paired differences on the primary (split, metric):

    share = (arm - reference) / (student - reference),

`student` the preset's unmasked arm, `reference` what the student is measured against (its sham
twin, the control arm or the base), each side's mean over its replicates and the questions. The
arm, the student and a trained reference read replicate i's numbers in the same order, so they
are paired by replicate.

The interval is Fieller's, by test inversion: the shares theta that a paired test of
arm - (theta x student + (1 - theta) x reference) = 0 does not reject at 5%, each test the
report's own (jobs/stats/transfer_stats.effect: other seeds and other questions, paired by
replicate), on a grid of theta from GRID[0] to GRID[-1]. Why not the delta method or a bootstrap:
the denominator is the student's effect, itself uncertain and near zero on a null, where a
delta-method interval is symmetric and far too narrow and a percentile bootstrap over three
replicates cannot show the spread. Fieller's set widens as the denominator loses significance
and becomes unbounded when the student's own effect is not detected: then no share is measured,
and the report says so. A side of the set that reaches the grid's end is reported as None
(unbounded).

Beside the shares, `divergence_vs_random` tests the divergence-masked arm against the
random-masked arm directly (paired): the difference the random mask, as a control, isolates.
"""

from __future__ import annotations

import numpy as np

from jobs.stats.results import MaskContrast, Ratio, Share, SignalRides
from jobs.stats.transfer_stats import effect

GRID = np.round(np.arange(-1.0, 2.0001, 0.005), 3)  # shares from -100% to 200%


def ratio_interval(num: np.ndarray, den: np.ndarray, clusters: np.ndarray, paired: bool) -> Ratio:
    """{value, ci95 ([low, high], a side None when unbounded), num_effect, den_effect, den_p}: the
    ratio of two effects, each given as [replicates x questions] of per-replicate differences from
    its reference, with Fieller's interval by test inversion: the ratios theta that the report's
    test of num - theta x den = 0 (paired by replicate, or two independent groups) keeps at 5%."""
    zero = np.zeros((1, num.shape[1]))
    num_effect = effect(num, zero, clusters, binary=False, b_fixed=True)  # = the paired test of arm against reference
    den_effect = effect(den, zero, clusters, binary=False, b_fixed=True)
    value = num_effect.value / den_effect.value if num_effect.value is not None and den_effect.value else None
    kept = []
    for theta in GRID:
        r = effect(num, theta * den, clusters, binary=False, paired=paired, p_only=True)
        if r.p_value is not None and r.p_value >= 0.05:
            kept.append(float(theta))
    ci = None
    if kept:
        ci = [None if kept[0] == GRID[0] else kept[0], None if kept[-1] == GRID[-1] else kept[-1]]
    return Ratio(
        value=value, ci95=ci, num_effect=num_effect.value, den_effect=den_effect.value, den_p=den_effect.p_value
    )


def share_interval(arm: np.ndarray, student: np.ndarray, reference: np.ndarray, clusters: np.ndarray) -> Share:
    """{value, ci95 ([low, high], a side None when unbounded), student_effect, arm_effect} for
    arrays [replicates x questions] (the reference may be one fixed row), paired by replicate."""
    reference = np.broadcast_to(reference, student.shape)
    r = ratio_interval(arm - reference, student - reference, clusters, paired=True)
    return Share(value=r.value, ci95=r.ci95, arm_effect=r.num_effect, student_effect=r.den_effect, student_p=r.den_p)


def phrase(share: Share) -> str:
    """A share and its interval in words."""
    if share.value is None:
        return "no share: the student moved 0"
    ci = share.ci95
    if ci is None:
        return f"{share.value:.0%} (no interval: no spread)"
    if ci[0] is None and ci[1] is None:  # the point ratio of two noises: say so before the number
        p = "" if share.student_p is None else f", p={share.student_p:.2g}"
        return f"not estimable: the student's own effect is not detected{p} (95% CI unbounded; point {share.value:.0%})"
    low = "unbounded" if ci[0] is None else f"{ci[0]:.0%}"
    high = "unbounded" if ci[1] is None else f"{ci[1]:.0%}"
    return f"{share.value:.0%} (95% CI {low} to {high})"


def where_signal_rides(ev, student: str, reference: str, kinds: dict[str, str]) -> SignalRides:
    """Each arm of `kinds` ({arm: kind}) as a share of `student`'s effect against `reference`, on
    the primary test; and the divergence mask against the random mask when both are declared.
    `ev` is the report's jobs.stats.evidence.Evidence."""
    from jobs.stats.transfer_stats import BINARY, detected

    split, metric = ev.primary
    clusters, teacher = ev.clusters[split], ev.teacher_of[student]

    def values(side):
        return ev.side_values(side, split, metric, None, teacher, False)

    arms = {}
    for name, kind in kinds.items():
        if (
            len(ev.members[name]) != len(ev.members[student])
            or ev.base_of[name] != ev.base_of[student]
            or ev.teacher_of[name] != teacher
        ):
            arms[name] = Share(
                kind=kind, value=None, ci95=None, note=f"not paired with {student} (replicates, base or teacher differ)"
            )
            continue
        arms[name] = Share.model_validate(
            {"kind": kind, **share_interval(values(name), values(student), values(reference), clusters).dump()}
        )
    out = {"student": student, "reference": reference, "split": split, "metric": metric, "arms": arms}
    masks = {kind: name for name, kind in kinds.items() if kind in ("divergence mask", "random mask")}
    if len(masks) == 2 and all(arms[name].note is None for name in masks.values()):
        r = effect(
            values(masks["divergence mask"]),
            values(masks["random mask"]),
            clusters,
            binary=metric in BINARY,
            paired=True,
        )
        contrast = {
            "arm": masks["divergence mask"],
            "against": masks["random mask"],
            **r.given(),
            "detected": detected(r),
        }
        out["divergence_vs_random"] = MaskContrast.model_validate(contrast)
    return SignalRides.model_validate(out)
