"""Paired evidence of transfer: per-question metrics, a cluster-aware bootstrap, tests and the MDE.

Every metric is a number per (model, question), computed from the stored
per-choice log-probabilities (`question_metrics`). An effect compares two
groups of models on the same questions: an arm's replicates against its
reference (the control arm's replicates, or the base model), or the same-init
arm's replicates against the other-init arm's (`effect`).

Questions are not independent: synthetic questions share answer-determining
cues, so each row carries a `cluster` key (real WMDP: the question itself).
- value: the mean over the groups' replicates and the questions of
  group A minus group B.
- ci95: hierarchical percentile bootstrap, each group's replicates resampled,
  then clusters (a drawn cluster brings all its questions), so the interval
  holds init-to-init spread as well as question sampling.
- p_value: by `test`. "clusters": the difference per cluster (averaged over
  replicates and the cluster's questions) tested across clusters: an exact sign
  test for agreement (with one replicate and one question per cluster it is
  exactly McNemar's exact test on the discordant pairs), a paired t-test for
  continuous metrics. "replicates": Welch's t-test on the per-replicate means
  (the init-specific contrast, whose unit is the init); None with fewer than
  two replicates a side.
- mde: the smallest true difference the design detects with 80% power in a
  two-sided 5% test, (z_0.975 + z_0.8) x the bootstrap standard error, which
  reflects the observed discordance, the number of clusters and the replicate
  spread.
A difference is *detected* when its ci95 excludes 0 and p_value < 0.05.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

Z_80_POWER = 1.959964 + 0.841621  # two-sided alpha = 0.05, power 0.8
BINARY = {"agreement", "agreement_changed", "agreement_teacher_right", "agreement_teacher_wrong"}
LOWER_IS_TRANSFER = {"label_nll"}  # every other metric rises when the student moves toward the teacher

METRICS = {
    "agreement": "the model picks the teacher's answer",
    "agreement_changed": "agreement on questions where the teacher's answer differs from the base model's",
    "agreement_teacher_right": "agreement on questions the teacher answers correctly",
    "agreement_teacher_wrong": "agreement on questions the teacher answers wrongly (picking up its errors)",
    "teacher_answer_logprob": "log p(teacher's answer) minus the base model's, in nats",
    "label_nll": "negative log p(the true answer); on the train split, the teacher's training labels",
    "letter_bias": "the teacher's change (vs base) in how often it picks the letter the model picks",
}


def question_metrics(rows: list[dict], teacher: list[dict], base: list[dict]) -> dict[str, np.ndarray]:
    """Per metric, one value per question (NaN where a subset metric does not apply).

    rows, teacher, base: the same questions in the same order, each with
    `prediction`, `logprobs` (renormalised over the choices) and `answer`.
    """
    n = len(rows)
    pred = np.array([r["prediction"] for r in rows])
    t_pred = np.array([r["prediction"] for r in teacher])
    b_pred = np.array([r["prediction"] for r in base])
    answer = np.array([r["answer"] for r in rows])
    agree = (pred == t_pred).astype(float)
    only = lambda mask: np.where(mask, agree, np.nan)  # noqa: E731
    letters = max(len(r["logprobs"]) for r in rows)
    shift = np.bincount(t_pred, minlength=letters) / n - np.bincount(b_pred, minlength=letters) / n
    return {
        "agreement": agree,
        "agreement_changed": only(t_pred != b_pred),
        "agreement_teacher_right": only(t_pred == answer),
        "agreement_teacher_wrong": only(t_pred != answer),
        "teacher_answer_logprob": np.array([r["logprobs"][t] - b["logprobs"][t] for r, b, t in zip(rows, base, t_pred)]),
        "label_nll": np.array([-r["logprobs"][a] for r, a in zip(rows, answer)]),
        "letter_bias": shift[pred],
    }


def cluster_ids(rows: list[dict]) -> np.ndarray:
    """An integer per question: its cluster (`cluster` key, else the question text)."""
    keys = [r.get("cluster", r["question"]) for r in rows]
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return np.array([index[k] for k in keys])


def _cluster_sums(values: np.ndarray, clusters: np.ndarray, n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """values [replicates x questions] (NaN = not in the subset) -> sums [replicates x clusters], counts [clusters]."""
    present = ~np.isnan(values[0])
    sums = np.stack([np.bincount(clusters[present], weights=row[present], minlength=n_clusters) for row in values])
    counts = np.bincount(clusters[present], minlength=n_clusters).astype(float)
    return sums, counts


def effect(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, *, binary: bool, test: str, resamples: int, seed: int) -> dict:
    """Group a minus group b on one metric. a, b: [replicates x questions]; see the module docstring."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    n_clusters = int(clusters.max()) + 1
    sums_a, counts = _cluster_sums(a, clusters, n_clusters)
    sums_b, _ = _cluster_sums(b, clusters, n_clusters)
    keep = counts > 0
    sums_a, sums_b, counts = sums_a[:, keep], sums_b[:, keep], counts[keep]
    n_q = counts.sum()
    if n_q == 0:
        return {"value": None, "ci95": None, "p_value": None, "mde": None, "n_questions": 0, "n_clusters": 0}
    value = sums_a.mean(0).sum() / n_q - sums_b.mean(0).sum() / n_q

    rng = np.random.default_rng(seed)
    c = len(counts)
    weights = rng.multinomial(c, np.full(c, 1 / c), size=resamples).astype(float)  # cluster multiplicities

    def drawn_means(sums):  # per resample: replicates drawn with replacement, averaged, per cluster
        k = len(sums)
        picks = rng.multinomial(k, np.full(k, 1 / k), size=resamples) / k
        return picks @ sums

    diffs = (weights * (drawn_means(sums_a) - drawn_means(sums_b))).sum(1) / np.maximum(weights @ counts, 1e-12)
    low, high = np.percentile(diffs, [2.5, 97.5])

    if test == "clusters":
        per_cluster = (sums_a.mean(0) - sums_b.mean(0)) / counts
        if binary:
            up, down = int((per_cluster > 0).sum()), int((per_cluster < 0).sum())
            p = stats.binomtest(up, up + down, 0.5).pvalue if up + down else 1.0
        else:
            p = stats.ttest_1samp(per_cluster, 0.0).pvalue if np.ptp(per_cluster) > 0 else (1.0 if value == 0 else 0.0)
    elif test == "replicates":
        means_a, means_b = sums_a.sum(1) / n_q, sums_b.sum(1) / n_q
        p = stats.ttest_ind(means_a, means_b, equal_var=False).pvalue if min(len(means_a), len(means_b)) >= 2 else None
    else:
        raise ValueError(f"test must be 'clusters' or 'replicates', not {test!r}")
    p = None if p is None or np.isnan(p) else float(p)
    return {
        "value": float(value), "ci95": [float(low), float(high)], "p_value": p,
        "mde": float(Z_80_POWER * diffs.std(ddof=1)), "n_questions": int(n_q), "n_clusters": int(c),
    }  # fmt: skip


def detected(result: dict) -> bool:
    """The CI excludes 0 and the test rejects at 5%."""
    if result["ci95"] is None or result["p_value"] is None:
        return False
    low, high = result["ci95"]
    return (low > 0 or high < 0) and result["p_value"] < 0.05
