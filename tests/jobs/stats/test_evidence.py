"""Comparisons of jobs/stats/evidence.py: the primary test and Holm, each model against its own base,
and transfer against training steps (each snapshot compared at the same step).

Scored rows are simulated here (the statistics are tests/jobs/stats/test_transfer_stats.py's; the
real pipeline writes such rows in tests/jobs/test_pipeline.py): a teacher that prefers
one answer per cluster, and students whose log p(teacher's answer) grows with the
step by a known amount, so the series must rise and end at the final comparison.
"""

import numpy as np
import pytest

from jobs.experiment.arms import ArmModel
from jobs.experiment.rows_kinds import KINDS
from jobs.stats.evidence import Evidence, apply_family
from jobs.stats.results import Comparison
from jobs.stats.verdicts import verdict
from train.config import TrainConfig

# resolved per arm by arm_models; Evidence reads none of it
PER_ARM = {"kind": KINDS["teacher"], "against": "base", "reference": "base model", "signal": None}

N_CLUSTERS, PER_CLUSTER, STEPS = 30, 4, (10, 20, 30)


def questions() -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {"question": f"q{c}-{k}", "cluster": c, "split": split, "answer": int(rng.integers(4))}
        for split in ("train", "held_out")
        for c in range(N_CLUSTERS)
        for k in range(PER_CLUSTER)
    ]


def scored(qs, rng, pull: float) -> list[dict]:
    """Each question's choice log-probabilities: noise, with `pull` nats more on choice (cluster % 4)."""
    rows = []
    for q in qs:
        logits = rng.normal(0, 0.3, 4)
        logits[q["cluster"] % 4] += pull
        logprobs = logits - np.log(np.exp(logits).sum())
        rows.append({**q, "prediction": int(np.argmax(logprobs)), "logprobs": logprobs.tolist()})
    return rows


def arm(name: str, replicates: int, base: str = "base") -> list[ArmModel]:
    return [
        ArmModel(name, i, "teacher", False, "logit_kl", "teacher", TrainConfig(), base == "base", base, **PER_ARM)
        for i in range(replicates)
    ]


@pytest.fixture(scope="module")
def experiment():
    """base, teacher; `learner` (3 replicates, 3 snapshots, each step pulls 0.01 nats more toward the
    teacher), `still` (3 replicates, 3 snapshots, no pull), `final_only` (no snapshots)."""
    rng, qs = np.random.default_rng(1), questions()
    scores = {"base": scored(qs, rng, 0.0), "teacher": scored(qs, rng, 3.0), "other_base": scored(qs, rng, 1.0)}
    models = arm("learner", 3) + arm("still", 3) + arm("final_only", 3) + arm("far", 3, "other_base")
    points = {}
    for m in models:
        per_step = 0.01 if m.arm == "learner" else 0.0
        if m.arm in ("final_only", "far"):  # far: the other base as it is (it already leans toward the teacher)
            scores[m.name] = scored(qs, rng, 1.0 if m.arm == "far" else 0.0)
            continue
        points[m.name] = [(s, m.name if s == STEPS[-1] else f"{m.name}@{s}") for s in STEPS]
        for step, name in points[m.name]:
            scores[name] = scored(qs, np.random.default_rng([models.index(m), step]), per_step * step)
    return Evidence(scores, models, ("train", "teacher_answer_logprob"), points)


def test_the_series_rises_with_the_pull_and_ends_at_the_final_comparison(experiment):
    series = experiment.by_step("learner", "base")
    assert [p.steps for p in series.points] == [[s] * 3 for s in STEPS]
    values = [p.train.metrics["teacher_answer_logprob"].value for p in series.points]
    assert values[0] < values[1] < values[2]
    final = experiment.compare("learner", "base").cell("train", "teacher_answer_logprob")
    assert series.points[-1].train.metrics["teacher_answer_logprob"].value == pytest.approx(final.value)
    assert set(series.points[0].held_out.metrics) == {"agreement", "teacher_answer_rank", "teacher_answer_logprob"}


def test_two_arms_with_snapshots_are_compared_step_by_step(experiment):
    series = experiment.by_step("learner", "still")
    first, last = (p.train.metrics["teacher_answer_logprob"] for p in (series.points[0], series.points[-1]))
    assert last.value > first.value and last.ci95 is not None


def test_an_arm_without_snapshots_has_no_series_and_a_mismatch_says_why(experiment):
    assert experiment.by_step("final_only", "base") is None
    mismatch = experiment.by_step("learner", "final_only")
    assert mismatch.points is None and "train.snapshots" in mismatch.note


def test_the_primary_test_decides_and_the_rest_are_holm_adjusted(experiment):
    result = experiment.compare("learner", "still")
    primary = result.primary
    assert (primary.split, primary.metric) == ("train", "teacher_answer_logprob") and primary.paired
    assert primary.value == result.cell("train", "teacher_answer_logprob").value and not primary.secondary
    secondary = [
        r
        for split in ("train", "held_out")
        for r in result.split(split).metrics.values()
        if r.p_value is not None and r.secondary
    ]
    assert len(secondary) >= 6 and all(r.p_holm >= r.p_value for r in secondary)
    assert all(r.detected == (r.p_holm < 0.05) for r in secondary)
    assert not experiment.compare("learner", "base").cell("train", "agreement").paired  # base is one fixed model


def test_an_arm_on_the_other_base_is_measured_against_its_own_base(experiment):
    # far is its base unchanged: no move against other_base, though that base already leans toward the teacher.
    own = experiment.compare("far", "other_base").cell("train", "teacher_answer_logprob")
    assert own.value == pytest.approx(0.0, abs=0.05) and not own.detected
    # Contrasts across bases compare changes: learner moved (0.3 nats at step 30), far did not.
    contrast = experiment.compare("learner", "far")
    assert contrast.cell("train", "teacher_answer_logprob").value > 0.1 and contrast.primary.paired
    assert (
        abs(contrast.cell("train", "agreement").value) < 0.5
        and contrast.cell("train", "agreement_changed").value is None
    )


def test_the_last_interval_says_whether_an_arm_was_still_learning(experiment):
    """learner gains 0.1 nats of pull between its last two snapshots; still gains nothing."""
    rising, flat = (experiment.by_step(arm, "base").last_interval for arm in ("learner", "still"))
    assert rising.from_steps == [STEPS[-2]] and rising.to_steps == [STEPS[-1]]
    assert rising.detected and rising.value > 0 and rising.ci95[0] > 0
    assert not flat.detected and flat.ci95[0] < 0 < flat.ci95[1]


def _comparison(p) -> Comparison:
    test = {"value": 0.1, "ci95": [0.0, 0.2], "p_value": p, "mde": 0.1, "detected": p is not None and p < 0.05}
    return Comparison.model_validate(
        {
            "train": {"mde": {}},
            "held_out": {"teacher_answer_logprob": dict(test), "mde": {}},
            "primary": {"split": "held_out", "metric": "teacher_answer_logprob", "direction": "toward_teacher", **test},
        }
    )


def test_holm_across_the_family_of_primary_verdicts_matches_a_hand_computation():
    every = {name: _comparison(p) for name, p in {"a": 0.01, "b": 0.04, "c": 0.03, "d": None}.items()}
    family, decided = apply_family(every, None)
    # By hand: sorted 0.01, 0.03, 0.04 of m = 3 -> 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04, raised to 0.06.
    assert family.dump() == {"comparisons": ["a", "b", "c", "d"], "size": 3, "declared": False}
    adjusted = {name: c.primary.p_family for name, c in decided.items()}
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": None})
    assert [decided[n].primary.detected for n in "abcd"] == [True, False, False, False]
    # the tables' copy of the test agrees
    assert decided["b"].cell("held_out", "teacher_answer_logprob").detected is False
    assert every["b"].primary.detected and every["b"].primary.p_family is None  # the comparisons given are not edited
    declared = {name: _comparison(p) for name, p in {"a": 0.01, "b": 0.04, "c": 0.03}.items()}
    # m = 2: 0.02 and 0.04, both detected; c is exploratory at its raw p
    family, decided = apply_family(declared, ["a", "b"])
    assert family.dump() == {"comparisons": ["a", "b"], "size": 2, "declared": True}
    assert [decided[n].primary.p_family for n in "abc"] == pytest.approx([0.02, 0.04, None])
    assert decided["c"].primary.exploratory and decided["c"].primary.detected
    assert verdict("c", "base", decided["c"]).startswith(
        "(exploratory, outside the preset's primary comparisons) c vs base"
    )
