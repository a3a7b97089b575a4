"""What the base did not know: the `changed` metrics (jobs/stats/transfer_stats.py), their readings
against a twin and against the base (jobs/stats/evidence.py), and the arm's one line
(jobs/stats/verdicts.changed).

Hand-made tables: the base picks choice 3 on every question, the teacher choice 0, the sham
choice 1 except on every 4th question, where it picks 0 as the teacher does. So every question is
`changed` for both teachers, and the crossed lean is 0 where their picks agree.
"""

import numpy as np
import pytest

# the same hand-made tables (pytest puts this folder on the path)
from test_directions import questions, row, sham_pick, with_pick

from jobs.experiment.arms import ArmModel
from jobs.experiment.rows_kinds import KINDS
from jobs.stats.evidence import SELECTED_BY_BASE, SUBSETS_DIFFER, Evidence
from jobs.stats.transfer_stats import question_metrics
from jobs.stats.verdicts import changed
from train.config import TrainConfig

# resolved per arm by arm_models; Evidence reads none of it
PER_ARM = {"kind": KINDS["teacher"], "against": "base", "reference": "base model", "signal": None}

BASE = [-2.0, -2.5, -3.0, -1.0]  # picks 3; ranks 0 above 1 above 2


def arms(replicates: int, base: str = "base") -> list[ArmModel]:
    """The student (on `base`) and its twin on the sham's numbers (on the first base)."""

    def arm(name, teacher, on):
        return [
            ArmModel(name, i, teacher, False, "logit_kl", teacher, TrainConfig(), True, base=on, **PER_ARM)
            for i in range(replicates)
        ]

    return arm("student", "teacher", base) + arm("student_sham", "sham_teacher", "base")


def evidence(shift, replicates: int = 3, clusters: int = 24, base: str = "base") -> Evidence:
    """shift(q, arm, replicate) -> the amount added to each choice's log-probability of the base's."""
    qs = questions(clusters)
    scores = {
        "base": [row(q, BASE) for q in qs],
        "teacher": [with_pick(q, 0) for q in qs],
        "sham_teacher": [with_pick(q, sham_pick(q)) for q in qs],
    }
    if base != "base":
        scores[base] = scores["base"]
    for m in arms(replicates, base):
        scores[m.name] = [row(q, np.add(BASE, shift(q, m.arm, m.replicate))) for q in qs]
    return Evidence(scores, arms(replicates, base), ("held_out", "teacher_answer_rank"), direction="crossed")


def noise(q: dict, arm: str, i: int) -> np.ndarray:
    """A small per-model, per-question jitter that never reorders the base's choices by itself."""
    return np.random.default_rng([q["cluster"], i, len(arm), q["split"] == "train"]).normal(0, 0.05, 4)


def test_the_rank_on_changed_questions_is_the_rank_where_the_teacher_left_the_base():
    qs = questions(2)
    base = [row(qs[0], BASE), row(qs[1], [-1.0, -2.0, -3.0, -4.0])]  # picks 3, then 0 (the teacher's pick)
    teacher = [with_pick(q, 0) for q in qs[:2]]
    model = [row(qs[0], [-1.5, -2.0, -3.0, -1.0]), row(qs[1], [-2.0, -1.0, -3.0, -4.0])]
    values = question_metrics(model, teacher, base)
    assert values["teacher_answer_rank"].tolist() == pytest.approx([2 / 3, 2 / 3])
    assert values["teacher_answer_rank_changed"][0] == pytest.approx(2 / 3) and np.isnan(
        values["teacher_answer_rank_changed"][1]
    )
    assert values["agreement_changed"][0] == 0 and np.isnan(values["agreement_changed"][1])


def test_a_student_that_takes_its_teachers_new_picks_learns_what_the_base_did_not_know():
    """Each student raises its own teacher's pick 1.5 nats (above the base's pick 3): crossed, on the
    changed train questions, detected against the twin and against the base alike."""

    def learn(q, arm, i):
        pick = 0 if arm == "student" else sham_pick(q)
        return noise(q, arm, i) + 1.5 * np.eye(4)[pick]

    ev = evidence(learn)
    transfer, against_base = ev.compare("student", "student_sham"), ev.compare("student", "base")
    reading = changed("student", "student_sham", transfer, against_base, "base")
    assert (reading.split, reading.metric, reading.direction) == ("train", "teacher_answer_rank_changed", "crossed")
    assert reading.learns and reading.result.value > 0.2 and reading.result.p_value < 0.05
    assert reading.against_base is not None and reading.against_base.value > 0.1
    assert reading.sentence.startswith("student learns what its teacher knows that the base does not: yes")


def test_drift_away_from_the_base_is_no_answer_against_the_base_and_only_the_twin_decides():
    """Both students move off the base's pick (choice 3 down), toward every other choice alike.
    Toward one teacher's changed picks that is selection, not learning: against the base it is not
    measured. Crossed against the base it cancels only as far as the base ranks the two teachers'
    picks alike: here it ranks the teacher's (0) above the sham's (1), so a drop that passes 0 but
    not 1 reads as a lean toward the teacher. That is why the twin, which drifts alike, decides."""
    # past both picks; past the teacher's alone (3 of 4 questions lean)
    for drop, crossed_vs_base in ((1.75, 0.0), (1.25, 0.125)):

        def drift(q, arm, i, drop=drop):
            return noise(q, arm, i) - drop * np.eye(4)[3]

        ev = evidence(drift)
        against_base = ev.compare("student", "base")
        for split in ("train", "held_out"):
            for metric in ("teacher_answer_rank_changed", "agreement_changed"):
                assert (
                    against_base.cell(split, metric).value is None
                    and against_base.cell(split, metric).note == SELECTED_BY_BASE
                )
                assert against_base.directions.toward_placebo[split][metric].note == SELECTED_BY_BASE
        assert against_base.directions.crossed["train"]["teacher_answer_rank_changed"].value == pytest.approx(
            crossed_vs_base, abs=0.01
        )
        assert against_base.cell("train", "teacher_answer_rank").value > 0.2  # the plain rank is fooled by the drift
        reading = changed("student", "student_sham", ev.compare("student", "student_sham"), against_base, "base")
        assert abs(reading.result.value) < 0.02 and not reading.learns and "not detected" in reading.sentence, (
            reading.sentence
        )


def test_across_bases_the_changed_subsets_differ_and_nothing_is_measured():
    ev = evidence(noise, base="other_base")  # the student on another base, its twin on the first
    result = ev.compare("student", "student_sham")
    for metric in ("teacher_answer_rank_changed", "agreement_changed"):
        assert result.cell("train", metric).note == SUBSETS_DIFFER
        assert result.directions.crossed["train"][metric].note == SUBSETS_DIFFER
    reading = changed("student", "student_sham", result, None, "other_base")
    assert not reading.learns and "is not measured against student_sham" in reading.sentence
