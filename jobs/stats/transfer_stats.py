"""Evidence of transfer: per-question metrics, an interval for other seeds and other questions, tests, MDE.

Every metric is a number per (model, question), computed from the stored
per-choice log-probabilities (`question_metrics`). An effect compares two
groups of models on the same questions (`effect`): an arm's replicates against
its reference (the control arm's replicates, or the fixed base model), or one
arm's replicates against another's (the same-init vs other-init contrast).

Two sources of chance, each counted once: which questions were asked
(synthetic questions share answer-determining cues, so each row carries a
`cluster` key; on real WMDP each question is its own cluster), and which seeds
trained the replicates (one LoRA init and data order is one draw: a model's
quirks move its answers on many questions at once).

Per-cluster values. A group's values [R replicates x questions] (NaN: the
question is not in the metric's subset, the same questions for every row and
both sides) become x[r, c] over the C non-empty clusters with the ratio
estimator's linearisation
    x_rc = C (S_rc - m n_c) / N + m,
S_rc replicate r's sum over cluster c's questions, n_c their count, N = sum n_c,
m the group's grand mean (sum of S over r and c, over R N). Averaging over c
gives replicate r's question-weighted mean (sum_c S_rc / N), so the plain mean
of x over r and c is m, and x_rc - x_r'c = C (S_rc - S_r'c) / N keeps the
replicates' differences. With equal clusters x_rc is just the cluster mean.

Two-way random effects. Take x_rc = mu + alpha_r + beta_c + gamma_rc, alpha the
seed (replicate) effect, beta the cluster effect, gamma their interaction (with
the within-cluster noise), independent, variances s_rep^2, s_clu^2, s_int^2.
The grand mean has Var = s_rep^2/R + s_clu^2/C + s_int^2/(RC). With
    MS_R = C var_r(row means)        E = s_int^2 + C s_rep^2   (R-1 df)
    MS_C = R var_c(column means)     E = s_int^2 + R s_clu^2   (C-1 df)
    MS_E = residual sum of squares / ((R-1)(C-1)),  E = s_int^2,
    Var = (MS_R + MS_C - MS_E) / (RC) = MS_C/(RC) + (MS_R - MS_E)/(RC),
unbiased; the interaction enters once, inside MS_C/(RC) = var_c(column means)/C
(the question term), and the second part is the replicate component
s_rep^2/R. A replicate component estimated below 0 (MS_R < MS_E) is set to 0,
as s_rep^2 >= 0 (the usual boundary rule; it makes the variance slightly
conservative when seeds hardly differ).
- paired (`paired=True`: both sides trained, equally many replicates, row i of
  a and of b sharing replicate i's numbers and data order, so their shared
  draw cancels in their difference): the model above on D = x_a - x_b.
- unpaired: the question term var_c(mean_r x_a[:, c] - mean_r x_b[:, c]) / C
  (each side's interaction over its own R inside it once) plus, for each side of
  trained replicates, its replicate component (MS_R - MS_E)/(RC) within that
  side. b_fixed (b is one fixed model, base): b adds no replicate term.
Degrees of freedom (`df`): Welch-Satterthwaite over the mean squares in the
variance, each with its coefficient and its df (MS_C or the question term C-1,
MS_R R-1, MS_E (R-1)(C-1)); with 3 replicates a replicate component has 2 df,
and the interval is as wide as that honestly makes it. With the subtracted MS_E
the approximation can collapse (MS_R barely above MS_E and MS_C small: 0.28 df
on two snapshots of one arm), so df is floored at the fewest df among the terms
added (R-1 when the replicate component is in): the variance is a sum of those
mean squares less a small part, and it is known at least as well as its
least-known added part.

Size of the test, set by the boundary rule (bench/rank_calibration.py): where the seeds have no
replicate component (teacher_answer_rank and agreement on the tiny world: over 60 controls their
replicate mean square is below the residual one), a trio's component estimated from 2 df is noise
that only adds when positive: the variance about 1.4x the value's, 1.4% false positives unpaired,
2.2% paired, on the planted bank. Where a component is there and 2 replicates estimate it (1 df),
it often falls below 0 and the test drops it: paired Gaussian nulls with rho = C s_rep^2 / s_int^2
of 1 to 16 give 8% to 14% at R = 2, 6% to 7% at R = 3, 5% to 6% at R = 5. Keeping the replicate mean square
always (a t at R - 1 df) holds 2.3% to 5.3% at every rho, at a t_0.975 of 12.7 with 2 replicates, 4.3 with 3.

Fields of a result:
- value: mean over a group's replicates and the questions, a minus b.
- ci95 and p_value: for other seeds and other questions: a t interval and
  test at `df` with the variance above. A side of trained replicates with only
  one member has no estimate of its seed spread: no ci95, p_value or mde then.
  A variance of zero (up to rounding: the replicates and clusters all agree)
  gives none of them either and a `note` saying so; never p = 0 or an interval
  of zero width.
- p_fixed_models: for these very models, questions the only chance: the
  per-cluster difference tested across clusters, an exact sign test for the
  agreement metrics (one replicate, one question per cluster: exactly McNemar's
  exact test on the discordant pairs), a paired t-test otherwise. A small value
  here with a large p_value says the models differ but seeds differ as much.
- mde: the smallest true difference the design detects with 80% power in a
  two-sided 5% t-test at the same df: delta x the standard error, delta the
  noncentrality at which a noncentral t with df degrees of freedom exceeds
  t_0.975 with probability 0.8 (4.26 at 3 df; the normal-theory shortcut
  t_0.975 + t_0.8 gives 4.16, 2% short there, and agrees above ~10 df). It
  reflects the observed discordance, the number of clusters and the replicate
  spread. Computed from an estimated SE, at about 3 df it is on average below
  the MDE at the true SE (its median about 0.9x), so a true effect of the
  reported MDE is detected nearer 70-75% of the time than 80%.
- n_questions, n_clusters: what the comparison held.
A difference is *detected* when p_value < 0.05 (its ci95 then excludes 0).
Several tests read together: `holm` adjusts their p-values.

(History: a percentile bootstrap over replicates was dropped first, since
resampling 3 values cannot show their spread. Then a cluster bootstrap of the
replicate-averaged differences plus each side's variance of replicate means
over R counted the interaction twice: the SE a quarter too wide, under 2% false
positives at a nominal 5% on simulated replicates.)"""

from __future__ import annotations

import numpy as np
from scipy import optimize, special, stats

from jobs.stats.results import Result

BINARY = {"agreement", "agreement_changed", "agreement_teacher_right", "agreement_teacher_wrong"}
LOWER_IS_TRANSFER = {"label_nll"}  # every other metric rises when the student moves toward the teacher

METRICS = {
    "agreement": "the model picks the teacher's answer",
    "agreement_changed": "agreement on questions where the teacher's answer differs from the base model's",
    "agreement_teacher_right": "agreement on questions the teacher answers correctly",
    "agreement_teacher_wrong": "agreement on questions the teacher answers wrongly (picking up its errors)",
    "teacher_answer_rank": "the share of the other choices the model ranks below the teacher's answer (ties count half)",
    "teacher_answer_rank_changed": "the same, on questions where the teacher's answer differs from the base model's: what the base did not know",
    "teacher_answer_logprob": "log p(teacher's answer) minus the base model's, in nats",
    "teacher_answer_logprob_calibrated": "the same, each model's choice distribution first put at the temperature that fits its own "
    "likelihood of the true answers on the known split (which no comparison reads): a flattening or sharpening alone cannot move it",
    "label_nll": "negative log p(the true answer); on the train split, the teacher's training labels",
    "letter_bias": "the teacher's change (vs base) in how often it picks the letter the model picks",
}


def question_metrics(
    rows: list[dict], teacher: list[dict], base: list[dict], temperatures: tuple[float, float] | None = None
) -> dict[str, np.ndarray]:
    """Per metric, one value per question (NaN where a subset metric does not apply).

    rows, teacher, base: the same questions in the same order, each with
    `prediction`, `logprobs` (renormalised over the choices) and `answer`.
    temperatures: (the model's, its base's) fitted temperatures (`fitted_temperature`); without
    them the calibrated log-probability is NaN (not measured).
    """
    n = len(rows)
    pred = np.array([r["prediction"] for r in rows])
    t_pred = np.array([r["prediction"] for r in teacher])
    b_pred = np.array([r["prediction"] for r in base])
    answer = np.array([r["answer"] for r in rows])
    agree = (pred == t_pred).astype(float)
    only = lambda mask: np.where(mask, agree, np.nan)  # noqa: E731
    letters = max(len(r["logprobs"]) for r in rows)
    rank = np.array([share_below(r["logprobs"], t) for r, t in zip(rows, t_pred)])
    shift = np.bincount(t_pred, minlength=letters) / n - np.bincount(b_pred, minlength=letters) / n
    return {
        "agreement": agree,
        "agreement_changed": only(t_pred != b_pred),
        "agreement_teacher_right": only(t_pred == answer),
        "agreement_teacher_wrong": only(t_pred != answer),
        "teacher_answer_rank": rank,
        "teacher_answer_rank_changed": np.where(t_pred != b_pred, rank, np.nan),
        "teacher_answer_logprob": np.array(
            [r["logprobs"][t] - b["logprobs"][t] for r, b, t in zip(rows, base, t_pred)]
        ),
        "teacher_answer_logprob_calibrated": _calibrated_change(rows, base, t_pred, temperatures),
        "label_nll": np.array([-r["logprobs"][a] for r, a in zip(rows, answer)]),
        "letter_bias": shift[pred],
    }


def _choice_matrix(rows: list[dict]) -> np.ndarray:
    """[rows x choices] of the rows' choice log-probabilities, -inf past a row's last choice (a row
    with fewer choices): one array for the temperature arithmetic, not one call per question."""
    out = np.full((len(rows), max(len(r["logprobs"]) for r in rows)), -np.inf)
    for i, r in enumerate(rows):
        out[i, : len(r["logprobs"])] = r["logprobs"]
    return out


def _at_temperature(logprobs: np.ndarray, tau: float) -> np.ndarray:
    """Each row's choice log-probabilities renormalised at temperature tau: log softmax(row / tau)."""
    z = logprobs / tau
    return z - special.logsumexp(z, axis=-1, keepdims=True)


def _calibrated_change(
    rows: list[dict], base: list[dict], t_pred: np.ndarray, temperatures: tuple[float, float] | None
) -> np.ndarray:
    if temperatures is None:
        return np.full(len(rows), np.nan)
    tau, tau_base = temperatures
    picked = np.arange(len(rows)), t_pred
    return _at_temperature(_choice_matrix(rows), tau)[picked] - _at_temperature(_choice_matrix(base), tau_base)[picked]


def fitted_temperature(rows: list[dict]) -> float:
    """The temperature tau at which softmax(logprobs / tau) gives the true answers of `rows` the
    highest likelihood (tau in [e^-4, e^4]). Fitted on questions no comparison reads (the known
    split), it puts every model's choice distributions on one footing: a student whose choices only
    flatten gets a lower tau and its calibrated log-probabilities are those of its order."""
    if not rows:
        raise ValueError("no rows to fit a temperature on")
    logprobs, true = _choice_matrix(rows), (np.arange(len(rows)), np.array([r["answer"] for r in rows]))

    def nll(log_tau: float) -> float:
        return -float(np.mean(_at_temperature(logprobs, np.exp(log_tau))[true]))

    return float(np.exp(optimize.minimize_scalar(nll, bounds=(-4.0, 4.0), method="bounded").x))


def choice_entropy(rows: list[dict]) -> float:
    """Mean entropy of the choice distributions, in nats (log 4 = 1.386 for four flat choices): how
    flat a model's answers are, whatever it picks."""
    return (
        float(np.mean([-(np.exp(lp) * lp).sum() for lp in (np.asarray(r["logprobs"], float) for r in rows)]))
        if rows
        else float("nan")
    )


def share_below(logprobs: list[float], t: int) -> float:
    """The share of the other choices whose log-probability is below choice t's (ties half).

    Unchanged by any order-keeping transform of one model's scores, a temperature
    included, so a student whose choice distributions only flatten or sharpen
    cannot move it: it moves when the order of the choices moves."""
    lp = np.asarray(logprobs, float)
    others = np.delete(lp, t)
    return float(((others < lp[t]).sum() + 0.5 * (others == lp[t]).sum()) / len(others))


def cluster_ids(rows: list[dict]) -> np.ndarray:
    """An integer per question: its cluster (`cluster` key, else the question text)."""
    keys = [r.get("cluster", r["question"]) for r in rows]
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return np.array([index[k] for k in keys])


def _cluster_sums(values: np.ndarray, clusters: np.ndarray, present: np.ndarray, n_clusters: int) -> np.ndarray:
    """values [replicates x questions] -> sums over each cluster's present questions [replicates x clusters]."""
    rows = len(values)
    index = (np.arange(rows)[:, None] * n_clusters + clusters[present][None, :]).ravel()
    return np.bincount(index, weights=values[:, present].ravel(), minlength=rows * n_clusters).reshape(rows, n_clusters)


def _linearised(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-cluster values x [replicates x clusters] whose plain mean is the question-weighted grand mean."""
    n, c = counts.sum(), len(counts)
    m = sums.sum() / (len(sums) * n)
    return c * (sums - m * counts) / n + m


def _mean_squares(x: np.ndarray) -> tuple[float, float, float]:
    """Two-way (replicates x clusters, one value a cell) mean squares: MS_R, MS_C, MS_E."""
    r, c = x.shape
    rows, cols = x.mean(1), x.mean(0)
    residual = x - rows[:, None] - cols[None, :] + x.mean()
    return c * rows.var(ddof=1), r * cols.var(ddof=1), float((residual**2).sum() / ((r - 1) * (c - 1)))


def _replicate_terms(x: np.ndarray) -> list[tuple[float, int]]:
    """The replicate component (MS_R - MS_E)/(RC) as Satterthwaite terms (value, df); none when it is estimated <= 0."""
    r, c = x.shape
    ms_r, _, ms_e = _mean_squares(x)
    return [(ms_r / (r * c), r - 1), (-ms_e / (r * c), (r - 1) * (c - 1))] if ms_r > ms_e else []


def _p_fixed_models(per_cluster: np.ndarray, value: float, binary: bool) -> float:
    """These very models, questions the only randomness: an exact sign test (McNemar) or a paired t
    across clusters of the per-cluster differences."""
    if binary:
        up, down = int((per_cluster > 0).sum()), int((per_cluster < 0).sum())
        return float(stats.binomtest(up, up + down, 0.5).pvalue if up + down else 1.0)
    return float(
        stats.ttest_1samp(per_cluster, 0.0).pvalue if np.ptp(per_cluster) > 0 else (1.0 if value == 0 else 0.0)
    )


def effect(
    a, b, clusters: np.ndarray, *, binary: bool, b_fixed: bool = False, paired: bool = False, p_only: bool = False
) -> Result:
    """Group a minus group b on one metric. a, b: [replicates x questions] (NaN: not in the
    metric's subset). b_fixed: b is one fixed model (base), not a sample of trained replicates.
    paired: both sides trained, equally many replicates, row i of a and of b sharing replicate i's
    numbers and data order. p_only: the value, ci95 and p_value alone (p_fixed_models and mde None),
    for a test inverted over a grid (jobs/stats/share.py): the MDE's root search is most of a call's
    time. See the module docstring for the method and each field."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if paired and (b_fixed or len(a) != len(b)):
        raise ValueError(
            f"paired needs two sides of trained replicates, equally many (got {len(a)} and {len(b)}, b_fixed={b_fixed})"
        )
    present = ~(np.isnan(a).any(0) | np.isnan(b).any(0))
    n_clusters = int(clusters.max()) + 1
    counts = np.bincount(clusters[present], minlength=n_clusters).astype(float)
    keep = counts > 0
    sums_a = _cluster_sums(a, clusters, present, n_clusters)[:, keep]
    sums_b = _cluster_sums(b, clusters, present, n_clusters)[:, keep]
    counts = counts[keep]
    n_q, c = counts.sum(), len(counts)
    empty = {
        "value": None,
        "ci95": None,
        "p_value": None,
        "mde": None,
        "p_fixed_models": None,
        "n_questions": int(n_q),
        "n_clusters": c,
    }
    if c < 2:
        return Result.model_validate(empty)
    value = sums_a.mean(0).sum() / n_q - sums_b.mean(0).sum() / n_q
    per_cluster = (sums_a.mean(0) - sums_b.mean(0)) / counts

    result = {
        **empty,
        "value": float(value),
        "p_fixed_models": None if p_only else _p_fixed_models(per_cluster, value, binary),
    }

    # Other seeds and other questions: the two-way random-effects variance, each source once.
    if len(a) < 2 or (len(b) < 2 and not b_fixed):
        # one replicate: its init-to-init spread is unknown, so no interval for other seeds
        return Result.model_validate(result)
    x_a, x_b = _linearised(sums_a, counts), _linearised(sums_b, counts)
    if paired:
        d = x_a - x_b
        terms = [(_mean_squares(d)[1] / d.size, c - 1), *_replicate_terms(d)]
    else:
        terms = [((x_a.mean(0) - x_b.mean(0)).var(ddof=1) / c, c - 1), *_replicate_terms(x_a)]
        terms += [] if b_fixed else _replicate_terms(x_b)
    variance = sum(v for v, _ in terms)
    scale = max(np.abs(x_a).max(), np.abs(x_b).max())
    if not variance > (1e-12 * scale) ** 2:  # zero up to rounding
        note = "zero spread: the replicates and questions showed no variation in this difference, so no interval can be computed"
        return Result.model_validate({**result, "note": note})
    # Welch-Satterthwaite, floored at the fewest df among the terms added: with the subtracted MS_E
    # it can fall far below them (0.28 on a real pair of snapshots), an interval a thousand SEs wide.
    df = max(variance**2 / sum(v**2 / d for v, d in terms), min(d for v, d in terms if v > 0))
    se = np.sqrt(variance)
    half = stats.t.ppf(0.975, df) * se
    return Result.model_validate(
        {
            **result,
            "ci95": [float(value - half), float(value + half)],
            "p_value": float(2 * stats.t.sf(abs(value) / se, df)),
            "mde": None if p_only else float(power_noncentrality(df) * se),
            "df": float(df),
        }
    )


def power_noncentrality(df: float, power: float = 0.8) -> float:
    """The true difference, in standard errors, that a two-sided 5% t-test at `df` detects with
    probability `power`: solves P(noncentral t(df, delta) > t_0.975) = power (the opposite tail,
    below 1e-3 there, left out)."""
    critical = stats.t.ppf(0.975, df)
    shortcut = critical + stats.t.ppf(power, df)
    return float(optimize.brentq(lambda delta: stats.nct.sf(critical, df, delta) - power, 0.5 * shortcut, 2 * shortcut))


def holm(p_values: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-Bonferroni adjusted p-values, in the input's order: the i-th smallest of m times (m - i + 1),
    made monotone and capped at 1. None stays None and is not counted in m."""
    tested = sorted(((p, k) for k, p in p_values.items() if p is not None), key=lambda pk: pk[0])
    adjusted, running = {}, 0.0
    for i, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - i) * p))
        adjusted[k] = running
    return {k: adjusted.get(k) for k in p_values}


def detected(result: Result) -> bool:
    """The test for other seeds and questions rejects at 5% (its ci95 then excludes 0)."""
    return result.p_value is not None and result.p_value < 0.05
