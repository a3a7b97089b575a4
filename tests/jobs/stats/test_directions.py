"""The placebo direction and the crossed effect (jobs/stats/evidence.Evidence.directions).

A student A of the teacher T against its twin B on the sham T'. With x_M^P model M's metric
toward teacher P's picks: toward the teacher x_A^T - x_B^T, toward the placebo x_B^T' - x_A^T',
crossed their mean. Hand-made tables: the teacher picks choice 0 everywhere, the sham picks
choice 1 except on one question in four, where both pick choice 0. Generic drift (a student moved
toward both teachers' picks alike, more for A than for B) must read 0 crossed and fool the one-
directional test; a teacher-specific shift (A toward T's picks, B toward T''s, by k) must read
3k/4 in every direction (the question where the picks agree contributes 0).
"""

import numpy as np
import pytest

from jobs.experiment.arms import ArmModel
from jobs.experiment.rows_kinds import KINDS
from jobs.stats.evidence import Evidence, apply_family
from jobs.stats.results import Comparison, Result
from train.config import TrainConfig

# resolved per arm by arm_models; Evidence reads none of it
PER_ARM = {"kind": KINDS["teacher"], "against": "base", "reference": "base model", "signal": None}

FLAT = [-1.4, -1.4, -1.4, -1.4]


def questions(clusters: int) -> list[dict]:
    """`clusters` clusters of one question per split; the sham picks choice 1 except on every 4th."""
    return [
        {"question": f"{split}{c}", "cluster": c, "split": split, "answer": 0}
        for split in ("train", "held_out")
        for c in range(clusters)
    ]


def sham_pick(q: dict) -> int:
    return 0 if q["cluster"] % 4 == 3 else 1


def row(q: dict, logprobs) -> dict:
    return {**q, "logprobs": list(map(float, logprobs)), "prediction": int(np.argmax(logprobs))}


def with_pick(q: dict, pick: int) -> dict:
    lp = [-3.0] * 4
    lp[pick] = 0.0
    return row(q, lp)


def models(replicates: int) -> list[ArmModel]:
    def arm(name, teacher):
        return [
            ArmModel(name, i, teacher, False, "logit_kl", teacher, TrainConfig(), True, **PER_ARM)
            for i in range(replicates)
        ]

    return arm("student", "teacher") + arm("student_sham", "sham_teacher")


def evidence(clusters: int, replicates: int, shift, direction: str = "toward_teacher") -> Evidence:
    """Scores of base, both teachers and both arms; shift(q, arm, replicate) -> the arm model's
    log-probabilities on q."""
    qs = questions(clusters)
    scores = {
        "base": [row(q, FLAT) for q in qs],
        "teacher": [with_pick(q, 0) for q in qs],
        "sham_teacher": [with_pick(q, sham_pick(q)) for q in qs],
    }
    for m in models(replicates):
        scores[m.name] = [row(q, shift(q, m.arm, m.replicate)) for q in qs]
    return Evidence(scores, models(replicates), ("held_out", "teacher_answer_logprob"), direction=direction)


def planted(q: dict, on: tuple[int, ...], by: float) -> list[float]:
    lp = list(FLAT)
    for choice in set(on):
        lp[choice] += by
    return lp


def readings(
    result: Comparison, split: str = "held_out", metric: str = "teacher_answer_logprob"
) -> tuple[Result, Result, Result]:
    return (
        result.cell(split, metric),
        result.directions.toward_placebo[split][metric],
        result.directions.crossed[split][metric],
    )


def test_generic_drift_cancels_in_the_crossed_effect_and_fools_the_one_directional_test():
    """A moves 0.3 nats toward both teachers' picks, B 0.1: toward the teacher +0.2, toward the
    placebo -0.2, crossed exactly 0."""
    drift = {"student": 0.3, "student_sham": 0.1}
    result = evidence(8, 2, lambda q, arm, i: planted(q, (0, sham_pick(q)), drift[arm])).compare(
        "student", "student_sham"
    )
    toward, placebo, crossed = readings(result)
    assert toward.value == pytest.approx(0.2) and placebo.value == pytest.approx(-0.2)
    assert crossed.value == pytest.approx(0.0, abs=1e-12)
    assert result.directions.placebo == "sham_teacher"


def test_a_teacher_specific_shift_reads_in_every_direction_and_agreeing_picks_count_zero():
    """A moves 0.4 nats toward T's pick, B toward T''s: on 3 of 4 questions the picks differ, so
    every direction reads 3/4 x 0.4 = 0.3."""
    result = evidence(8, 2, lambda q, arm, i: planted(q, (0,) if arm == "student" else (sham_pick(q),), 0.4)).compare(
        "student", "student_sham"
    )
    toward, placebo, crossed = readings(result)
    assert (
        toward.value == pytest.approx(0.3)
        and placebo.value == pytest.approx(0.3)
        and crossed.value == pytest.approx(0.3)
    )


def test_with_noise_the_crossed_test_detects_knowledge_and_not_drift():
    """40 clusters, 3 paired replicates, seed noise on every choice. Planted drift: A 0.5 nats more
    than B toward both picks, detected toward the teacher, not crossed; planted knowledge: 0.3
    nats each toward its own teacher's picks, detected crossed."""

    def noisy(extra):
        def shift(q, arm, i):
            rng = np.random.default_rng([q["cluster"], i, arm == "student", q["split"] == "train"])
            return np.array(FLAT) + rng.normal(0, 0.2, 4) + extra(q, arm)

        return shift

    def drift(q, arm):
        out = np.zeros(4)
        out[[0, sham_pick(q)]] = 0.5 if arm == "student" else 0.0
        return out

    def knowledge(q, arm):
        out = np.zeros(4)
        out[0 if arm == "student" else sham_pick(q)] = 0.3
        return out

    drifted = evidence(40, 3, noisy(drift), "crossed").compare("student", "student_sham")
    toward, _, crossed = readings(drifted)
    assert toward.p_value < 0.05 and crossed.p_value > 0.05, (toward, crossed)
    assert drifted.primary.direction == "crossed" and drifted.primary.value == crossed.value
    knowing = evidence(40, 3, noisy(knowledge), "crossed").compare("student", "student_sham")
    assert knowing.primary.detected and knowing.primary.value > 0.15, knowing.primary
    family, decided = apply_family({"student": knowing}, None)  # Holm marks the crossed test where the tables list it
    knowing = decided["student"]
    assert (
        family.size == 1
        and knowing.directions.crossed["held_out"]["teacher_answer_logprob"].p_family
        == knowing.primary.p_family
        is not None
    )


def test_no_placebo_without_a_scored_sham():
    qs = questions(8)
    scores = {"base": [row(q, FLAT) for q in qs], "teacher": [with_pick(q, 0) for q in qs]}
    students = [
        ArmModel("student", i, "teacher", False, "logit_kl", "teacher", TrainConfig(), True, **PER_ARM)
        for i in range(2)
    ]
    scores |= {m.name: [row(q, planted(q, (0,), 0.1 * (m.replicate + 1))) for q in qs] for m in students}
    result = Evidence(scores, students, ("held_out", "teacher_answer_logprob"), direction="crossed").compare(
        "student", "base"
    )
    assert result.directions is None and result.primary.value is None and "no crossed effect" in result.primary.note
