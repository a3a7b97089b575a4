"""Paired evidence of transfer: per-question metrics, an interval that holds replicate spread, tests, MDE.

Every metric is a number per (model, question), computed from the stored
per-choice log-probabilities (`question_metrics`). An effect compares two
groups of models on the same questions (`effect`): an arm's replicates against
its reference (the control arm's replicates, or the fixed base model), or one
arm's replicates against another's (the same-init vs other-init contrast).

Two sources of chance: which questions were asked (synthetic questions share
answer-determining cues, so each row carries a `cluster` key; on real WMDP each
question is its own cluster), and which seeds trained the replicates (one
LoRA init and data order is one draw: a model's quirks move its answers on many
questions at once).
- value: mean over a group's replicates and the questions, a minus b.
- ci95 and p_value: for other seeds and other questions. The variance of the
  difference is the variance over a bootstrap of question clusters (`resamples`
  draws of clusters with replacement, a drawn cluster bringing all its
  questions) plus, for each group of trained replicates, the variance of its
  replicate means over its replicate count; a t interval and test with
  Welch-Satterthwaite degrees of freedom. With 3 replicates the replicate term has 2 degrees of freedom,
  and the interval is as wide as that honestly makes it. A group of trained
  replicates with only one member has no estimate of its spread: no ci95,
  p_value or mde then.
- p_fixed_models: for these very models, questions the only chance: the
  per-cluster difference tested across clusters, an exact sign test for the
  agreement metrics (one replicate, one question per cluster: exactly McNemar's
  exact test on the discordant pairs), a paired t-test otherwise. A small value
  here with a large p_value says the models differ but seeds differ as much.
- mde: the smallest true difference the design detects with 80% power in a
  two-sided 5% t-test: (t_0.975 + t_0.8) x the standard error, at the same
  degrees of freedom; it reflects the observed discordance, the number of
  clusters and the replicate spread.
A difference is *detected* when p_value < 0.05 (its ci95 then excludes 0).

A percentile bootstrap over replicates, then clusters, was the first design and
was dropped for the replicate level: with 3 replicates a side it covered 0 in
70% of control-vs-control nulls on the tiny model (a LoRA teacher, replicates
with their own noise, as in tests/test_transfer_calibration.py), since
resampling 3 values cannot show their spread; the t term above does, at 2
degrees of freedom per side."""

from __future__ import annotations

import numpy as np
from scipy import stats

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


def effect(a, b, clusters: np.ndarray, *, binary: bool, b_fixed: bool = False, resamples: int = 1000, seed: int = 0) -> dict:
    """Group a minus group b on one metric. a, b: [replicates x questions] (NaN: not in the
    metric's subset). b_fixed: b is one fixed model (base), not a sample of trained replicates.
    resamples, seed: the cluster bootstrap. See the module docstring for each field."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    n_clusters = int(clusters.max()) + 1
    sums_a, counts = _cluster_sums(a, clusters, n_clusters)
    sums_b, _ = _cluster_sums(b, clusters, n_clusters)
    keep = counts > 0
    sums_a, sums_b, counts = sums_a[:, keep], sums_b[:, keep], counts[keep]
    n_q, c = counts.sum(), len(counts)
    empty = {"value": None, "ci95": None, "p_value": None, "mde": None, "p_fixed_models": None, "n_questions": int(n_q), "n_clusters": c}
    if c < 2:
        return empty
    value = sums_a.mean(0).sum() / n_q - sums_b.mean(0).sum() / n_q
    per_cluster = (sums_a.mean(0) - sums_b.mean(0)) / counts

    # These very models, questions the only randomness: exact sign test (McNemar) or paired t across clusters.
    if binary:
        up, down = int((per_cluster > 0).sum()), int((per_cluster < 0).sum())
        p_fixed = stats.binomtest(up, up + down, 0.5).pvalue if up + down else 1.0
    else:
        p_fixed = stats.ttest_1samp(per_cluster, 0.0).pvalue if np.ptp(per_cluster) > 0 else (1.0 if value == 0 else 0.0)
    result = {**empty, "value": float(value), "p_fixed_models": float(p_fixed)}

    # Other seeds and other questions: variance from the replicates' spread plus the clusters'.
    draws = np.random.default_rng(seed).multinomial(c, np.full(c, 1 / c), size=resamples)  # cluster multiplicities
    resampled = draws @ (per_cluster * counts) / np.maximum(draws @ counts, 1e-12)
    components = [(resampled.var(ddof=1), c - 1)]
    for sums, fixed in ((sums_a, False), (sums_b, b_fixed)):
        if fixed:
            continue
        if len(sums) < 2:
            return result  # one replicate: its init-to-init spread is unknown, so no interval for other seeds
        means = sums.sum(1) / n_q
        components.append((means.var(ddof=1) / len(means), len(means) - 1))
    variance = sum(v for v, _ in components)
    if variance == 0:
        return {**result, "ci95": [float(value)] * 2, "p_value": (1.0 if value == 0 else 0.0), "mde": 0.0}
    df = variance**2 / sum(v**2 / d for v, d in components)  # Welch-Satterthwaite
    se = np.sqrt(variance)
    half = stats.t.ppf(0.975, df) * se
    return {
        **result, "ci95": [float(value - half), float(value + half)], "p_value": float(2 * stats.t.sf(abs(value) / se, df)),
        "mde": float((stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * se), "df": float(df),
    }  # fmt: skip


def detected(result: dict) -> bool:
    """The test for other seeds and questions rejects at 5% (its ci95 then excludes 0)."""
    return result["p_value"] is not None and result["p_value"] < 0.05
