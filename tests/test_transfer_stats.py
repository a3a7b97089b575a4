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
    result = effect(a, b, np.arange(300), binary=True)
    up, down = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    assert result["p_fixed_models"] == pytest.approx(mcnemar_exact(up, down), rel=1e-9)
    assert result["value"] == pytest.approx(a.mean() - b.mean())
    # One trained model a side says nothing about other seeds: no interval for them.
    assert result["ci95"] is result["p_value"] is result["mde"] is None and not detected(result)
    # Against a fixed model (base) only a's seeds vary; with one of them, still none.
    assert effect(a, b, np.arange(300), binary=True, b_fixed=True)["p_value"] is None


def simulated(rng, replicates=3, shift=0.0, model_sd=0.05, cluster_sd=0.3, n_clusters=40, per_cluster=8):
    """Continuous per-question scores of two groups of models on the same questions. Each
    model (a training seed) has its own overall offset (model_sd) and its own offset per
    question cluster (cluster_sd): the spread a real replicate brings. Group a is `shift` up."""
    clusters = np.repeat(np.arange(n_clusters), per_cluster)
    questions = rng.normal(0, 1, clusters.size)  # what every model shares: cancels in a paired difference

    def model(delta):
        return questions + delta + rng.normal(0, model_sd) + rng.normal(0, cluster_sd, n_clusters)[clusters] + rng.normal(0, 0.5, clusters.size)

    return np.array([model(shift) for _ in range(replicates)]), np.array([model(0.0) for _ in range(replicates)]), clusters


def null_results(replicates: int, questions_independent: bool = False, reps: int = 150) -> list[dict]:
    """Effects on nulls (no true difference), analysed with clusters unless told otherwise."""
    rng = np.random.default_rng(7)
    results = []
    for _ in range(reps):
        a, b, clusters = simulated(rng, replicates=replicates)
        results.append(effect(a, b, np.arange(clusters.size) if questions_independent else clusters, binary=False))
    return results


def test_testing_one_model_a_side_over_questions_finds_effects_that_are_not_there():
    # What a test over questions alone does with one model per side: the models' own quirks look like an effect.
    assert np.mean([r["p_fixed_models"] < 0.05 for r in null_results(1, questions_independent=True)]) > 0.3


def test_three_replicates_a_side_keep_false_positives_and_coverage_honest():
    results = null_results(3)
    assert np.mean([detected(r) for r in results]) <= 0.07
    assert np.mean([r["ci95"][0] <= 0 <= r["ci95"][1] for r in results]) >= 0.93


def test_power_at_the_reported_mde_is_about_eighty_percent():
    rng = np.random.default_rng(3)
    mde = np.mean([effect(*simulated(rng), binary=False)["mde"] for _ in range(20)])
    hits = [detected(r) and r["value"] > 0 for r in (effect(*simulated(rng, shift=mde), binary=False) for _ in range(200))]
    assert 0.65 <= np.mean(hits) <= 0.95


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
