"""jobs/transfer_stats.py on data with known truth: McNemar's exact test, cluster-aware
coverage under a null, and power at the reported minimum detectable effect."""

import math

import numpy as np
import pytest

from jobs.transfer_stats import cluster_ids, detected, effect, question_metrics


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p from the discordant counts, written out."""
    n, k = b + c, min(b, c)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def test_one_replicate_one_question_per_cluster_is_mcnemar():
    rng = np.random.default_rng(0)
    a = (rng.random(300) < 0.55).astype(float)
    b = (rng.random(300) < 0.45).astype(float)
    result = effect(a, b, np.arange(300), binary=True, test="clusters", resamples=2000, seed=1)
    up, down = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    assert result["p_value"] == pytest.approx(mcnemar_exact(up, down), rel=1e-9)
    assert result["value"] == pytest.approx(a.mean() - b.mean())
    assert result["ci95"][0] < result["value"] < result["ci95"][1]


def simulated(rng, replicates=3, shift=0.0, model_sd=0.05, cluster_sd=0.3, n_clusters=40, per_cluster=8):
    """Continuous per-question scores of two groups of models on the same questions. Each
    model (a training seed) has its own overall offset (model_sd) and its own offset per
    question cluster (cluster_sd): the spread a real replicate brings. Group a is `shift` up."""
    clusters = np.repeat(np.arange(n_clusters), per_cluster)
    questions = rng.normal(0, 1, clusters.size)  # what every model shares: cancels in a paired difference

    def model(delta):
        return questions + delta + rng.normal(0, model_sd) + rng.normal(0, cluster_sd, n_clusters)[clusters] + rng.normal(0, 0.5, clusters.size)

    return np.array([model(shift) for _ in range(replicates)]), np.array([model(0.0) for _ in range(replicates)]), clusters


def false_positive_rate(reps=150, **analysis) -> float:
    """Share of nulls (no true difference) declared detected under `analysis`."""
    rng = np.random.default_rng(7)
    replicates, independent = analysis.pop("replicates"), analysis.pop("questions_independent", False)
    hits = 0
    for r in range(reps):
        a, b, clusters = simulated(rng, replicates=replicates)
        keys = np.arange(clusters.size) if independent else clusters
        hits += detected(effect(a, b, keys, binary=False, resamples=400, seed=r, **analysis))
    return hits / reps


def test_one_model_a_side_with_questions_as_independent_finds_effects_that_are_not_there():
    # What a CI over questions alone does with one model per side: the models' own quirks look like an effect.
    assert false_positive_rate(replicates=1, questions_independent=True, test="clusters") > 0.3


@pytest.mark.parametrize("test", ["clusters", "replicates"])
def test_replicates_and_clusters_keep_false_positives_near_five_percent(test):
    assert false_positive_rate(replicates=3, test=test) <= 0.08


def test_power_at_the_reported_mde_is_about_eighty_percent():
    rng = np.random.default_rng(3)
    a, b, clusters = simulated(rng)
    mde = effect(a, b, clusters, binary=False, test="clusters", resamples=1000, seed=0)["mde"]
    hits = 0
    for r in range(100):
        a, b, clusters = simulated(rng, shift=mde)
        hits += detected(effect(a, b, clusters, binary=False, test="clusters", resamples=400, seed=r))
    assert 0.6 <= hits / 100 <= 0.97


def test_question_metrics_from_stored_logprobs():
    lp = lambda *p: list(np.log(p))  # noqa: E731
    base = [{"prediction": 0, "answer": 1, "logprobs": lp(0.7, 0.1, 0.1, 0.1), "question": "q0"},
            {"prediction": 1, "answer": 1, "logprobs": lp(0.1, 0.7, 0.1, 0.1), "question": "q1"}]  # fmt: skip
    teacher = [{**base[0], "prediction": 1, "logprobs": lp(0.1, 0.7, 0.1, 0.1)}, {**base[1], "prediction": 2, "logprobs": lp(0.1, 0.1, 0.7, 0.1)}]
    student = [{**base[0], "prediction": 1, "logprobs": lp(0.2, 0.6, 0.1, 0.1)}, {**base[1], "prediction": 1, "logprobs": lp(0.1, 0.6, 0.2, 0.1)}]
    m = question_metrics(student, teacher, base)
    assert m["agreement"].tolist() == [1.0, 0.0]
    assert m["agreement_teacher_right"][0] == 1.0 and np.isnan(m["agreement_teacher_right"][1])
    assert m["agreement_teacher_wrong"][1] == 0.0 and np.isnan(m["agreement_teacher_wrong"][0])
    assert m["teacher_answer_logprob"] == pytest.approx([math.log(0.6 / 0.1), math.log(0.2 / 0.1)])
    assert m["label_nll"] == pytest.approx([-math.log(0.6), -math.log(0.6)])
    # The teacher picks B and C once each where base picked A and B: C gained, A lost.
    assert m["letter_bias"].tolist() == [0.0, 0.0]
    assert question_metrics(teacher, teacher, base)["letter_bias"].tolist() == [0.0, 0.5]
    assert cluster_ids([{"question": "x", "cluster": "k"}, {"question": "y", "cluster": "k"}, {"question": "z"}]).tolist() == [0, 0, 1]
