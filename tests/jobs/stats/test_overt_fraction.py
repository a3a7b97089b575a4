"""An arm's effect as a fraction of the overt control's (Evidence.fraction_of, evidence.overt_control):
held out, with Fieller's interval, the overt effect's own uncertainty included.

Simulated scores: the teacher picks choice 0; each replicate of `student` moves log p of choice 0
by 0.1 nats plus its own seed effect, each of `overt` by 0.4 plus a seed effect four times larger
than the student's; both against the base. The fraction's point is near 1/4, and its interval,
which holds the overt effect's spread, is wider than the student's interval divided by the overt
effect taken as fixed (what the report gave before).
"""

import numpy as np
import pytest

from jobs.experiment.arms import ArmModel
from jobs.experiment.rows_kinds import KINDS
from jobs.stats.evidence import Evidence
from jobs.stats.verdicts import fraction_phrase, overt_control
from train.config import TrainConfig

# resolved per arm by arm_models; Evidence reads none of it
PER_ARM = {"kind": KINDS["teacher"], "against": "base", "reference": "base model", "signal": None}

CLUSTERS, REPLICATES = 30, 4


def rows(shift, seed) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for split in ("train", "held_out"):
        for c in range(CLUSTERS):
            lp = np.log(np.full(4, 0.25)) + rng.normal(0, 0.05, 4)
            lp[0] += shift
            out.append(
                {
                    "question": f"{split}{c}",
                    "cluster": c,
                    "split": split,
                    "answer": 0,
                    "logprobs": lp.tolist(),
                    "prediction": int(np.argmax(lp)),
                }
            )
    return out


@pytest.fixture(scope="module")
def evidence():
    models = [
        ArmModel(arm, i, "teacher", False, "sft", "teacher", TrainConfig(), True, **PER_ARM)
        for arm in ("student", "overt")
        for i in range(REPLICATES)
    ]
    seeds = np.random.default_rng(7)
    scores = {"base": rows(0.0, 1), "teacher": rows(3.0, 2)}
    for m in models:
        scores[m.name] = rows(
            (0.1 + seeds.normal(0, 0.02)) if m.arm == "student" else (0.4 + seeds.normal(0, 0.08)), 100 + len(scores)
        )
    return Evidence(scores, models, ("held_out", "teacher_answer_logprob"))


def test_the_fraction_of_overt_carries_the_overt_effects_uncertainty(evidence):
    fraction = evidence.fraction_of("student", "base", "overt", "base")
    assert fraction.split == "held_out" and fraction.value == pytest.approx(fraction.num_effect / fraction.den_effect)
    assert 0.15 < fraction.value < 0.35 and fraction.ci95[0] < fraction.value < fraction.ci95[1]
    student, overt = evidence.compare("student", "base"), evidence.compare("overt", "base")
    fixed = [
        c / overt.cell("held_out", "teacher_answer_logprob").value
        for c in student.cell("held_out", "teacher_answer_logprob").ci95
    ]
    assert fraction.ci95[1] - fraction.ci95[0] > fixed[1] - fixed[0], (fraction.ci95, fixed)


def test_every_arm_gets_its_fraction_once_the_overt_control_is_detected(evidence):
    transfers = {name: evidence.compare(name, "base") for name in ("student", "overt")}
    control, fractions = overt_control(transfers, {"student": "base", "overt": "base"}, "overt", evidence)
    assert (
        control.detected and fractions["overt"].value == pytest.approx(1.0) and set(fractions) == {"student", "overt"}
    )
    assert "of overt transfer on held-out teacher_answer_logprob (95% CI" in fraction_phrase(fractions["student"])
    assert overt_control(transfers, {"student": "base", "overt": "base"}, None, evidence) == (None, {})
