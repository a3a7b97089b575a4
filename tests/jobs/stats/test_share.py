"""The share of the student's effect an arm keeps (jobs/stats/share.py): Fieller's interval by test
inversion holds the true share when the student's effect is clear, and is unbounded when it is not."""

import numpy as np

from jobs.stats.share import phrase, share_interval


def groups(student_effect: float, share: float, seed: int, replicates: int = 3, questions: int = 400):
    """[replicates x questions] arm, student and a trained reference, replicate i's three sharing a draw."""
    rng = np.random.default_rng(seed)
    question = rng.normal(0, 0.3, questions)  # how each question sits, shared by every model
    shared = rng.normal(0, 0.02, (replicates, 1))  # replicate i's numbers and data order

    def side(shift):
        return (
            question
            + shared
            + shift
            + rng.normal(0, 0.01, (replicates, 1))
            + rng.normal(0, 0.2, (replicates, questions))
        )

    return side(share * student_effect), side(student_effect), side(0.0)


def test_a_clear_effect_gives_the_share_with_an_interval_around_it():
    clusters = np.arange(400)
    arm, student, reference = groups(0.4, 0.5, seed=0)
    s = share_interval(arm, student, reference, clusters)
    assert s.value == s.arm_effect / s.student_effect and 0.3 < s.value < 0.7
    low, high = s.ci95
    assert low is not None and high is not None and low < s.value < high and 0 < low and high < 1, s
    assert phrase(s).startswith(f"{s.value:.0%} (95% CI {low:.0%} to")


def test_a_student_without_an_effect_leaves_the_share_unbounded():
    clusters = np.arange(400)
    arm, student, reference = groups(0.0, 0.5, seed=1)
    s = share_interval(arm, student, reference, clusters)
    assert s.student_p > 0.05 and None in s.ci95, s
    assert "unbounded" in phrase(s)


def test_a_fixed_reference_row_is_paired_with_every_replicate():
    clusters = np.arange(400)
    arm, student, reference = groups(0.4, 1.0, seed=2)
    s = share_interval(arm, student, reference[:1], clusters)  # one fixed model: the base
    assert s.ci95[0] is not None and s.ci95[0] < 1.0 < s.ci95[1]
