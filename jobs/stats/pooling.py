"""Pairs as the unit: each teacher–sham pair's effect pooled with a random-effects model.

A verdict must hold for other teachers, not only for the one trained. P teacher–sham pairs on one
base give P estimates d_k, each with its within-pair variance v_k (its SE squared from
jobs/stats/transfer_stats.effect: other seeds and other questions). The model:

    d_k = mu + u_k + e_k,   u_k ~ N(0, tau^2) (the pair's own effect),   e_k ~ N(0, v_k),

v_k taken as known. `pool` estimates mu, tau^2 and the pooled CI and p:

- tau^2 by REML (the default: the restricted likelihood's maximum over tau^2 >= 0) or by
  DerSimonian-Laird's moment estimator, max(0, (Q - (P-1)) / (S1 - S2/S1)), S_j = sum of (1/v_k)^j.
- mu = sum w_k d_k / sum w_k, w_k = 1 / (v_k + tau^2).
- its variance (`test`): "hk_max1", the default, is Hartung-Knapp with the ad hoc correction of Knapp
  and Hartung (2003): max(1, q) / sum w_k, q = sum w_k (d_k - mu)^2 / (P-1), on a t with P-1 df;
  "hk" the plain Hartung-Knapp(-Sidik-Jonkman) q / sum w_k on the same t (too narrow when q < 1,
  which with few pairs is often: kept for comparison only); "wald" 1 / sum w_k on the normal, the
  classic DerSimonian-Laird test (too narrow with few pairs: for contrast); "t" weighs the pairs
  alike, the mean of the d_k with the SE of their spread, on the same t: it reads no v_k, so its
  size holds where the v_k are poor estimates (pairs of 2 replicates: within df 2 to 14), where
  both HK tests turn liberal; it loses little where the pairs' true SEs are alike by design.
- heterogeneity: Cochran's Q = sum (d_k - mu_FE)^2 / v_k, its p from chi^2 with P-1 df; tau, the
  SD of the pairs' true effects; I^2 = tau^2 / (tau^2 + s^2), s^2 the typical within-pair variance
  of Higgins and Thompson (2002), (P-1) S1 / (S1^2 - S2) (with DerSimonian-Laird's tau^2 this is
  (Q - (P-1)) / Q, floored at 0).

One pair is no pooling: `pool` raises for P < 2, and the report keeps the pair's own analysis
(transfer_stats.effect), labelled as one pair. docs/pooling.md gives the formulas, the simulated
size (`simulate_rejection`, bench/pooling_size.py) and the MDE.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy import stats

from jobs.stats.transfer_stats import power_noncentrality

Tau2Method = Literal["reml", "dl"]
Test = Literal["hk_max1", "hk", "wald", "t"]
TESTS = ("hk_max1", "hk", "wald", "t")
TAU2_METHODS = ("reml", "dl")


@dataclass(frozen=True)
class PairRow:
    """One pair's own estimate: its SE and CI (a t at its own df when given, else normal), and its
    share of the pooled estimate (w_k / sum w)."""

    name: str
    estimate: float
    se: float
    ci: tuple[float, float]
    weight: float


@dataclass(frozen=True)
class Pooled:
    """The pooled effect of P >= 2 pairs: estimate (mu) and se by `test`, its (1 - alpha) ci and
    p_value (a t at df = P-1, the normal for "wald"); tau2 by `tau2_method`, tau, i2 (a fraction);
    Cochran's q and q_p_value; each pair's row in input order. ci and p_value are None only when
    the test's variance is 0 (plain HK with pairs that agree exactly): never p = 0 or an interval of
    zero width."""

    estimate: float
    se: float
    ci: tuple[float, float] | None
    p_value: float | None
    df: int
    tau2: float
    tau: float
    i2: float
    q: float
    q_p_value: float
    n_pairs: int
    pairs: tuple[PairRow, ...]
    tau2_method: str
    test: str
    alpha: float

    def to_dict(self) -> dict:
        """Plain JSON-ready fields (tuples become lists when dumped)."""
        return asdict(self)


def _checked(estimates, variances, names, pair_df) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]:
    """The inputs as arrays, or a ValueError naming what is wrong."""
    y = np.asarray(estimates, dtype=float)
    v = np.asarray(variances, dtype=float)
    if y.ndim != 1 or v.ndim != 1:
        raise ValueError(f"pooling: estimates and variances must be flat sequences, got shapes {y.shape} and {v.shape}")
    if len(y) != len(v):
        raise ValueError(f"pooling: {len(y)} estimates but {len(v)} variances")
    if len(y) == 0:
        raise ValueError("pooling: no pairs")
    if len(y) == 1:
        raise ValueError(
            "pooling: one pair cannot be pooled (no spread between pairs to estimate); report the pair's own analysis, labelled as one pair"
        )
    if not np.all(np.isfinite(y)):
        raise ValueError(f"pooling: estimates must be finite, got {y.tolist()}")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"pooling: within-pair variances must be finite and > 0, got {v.tolist()}")
    names = [f"pair {k}" for k in range(len(y))] if names is None else [str(n) for n in names]
    if len(names) != len(y) or len(set(names)) != len(names):
        raise ValueError(f"pooling: need {len(y)} distinct pair names, got {names}")
    df = None
    if pair_df is not None:
        df = np.asarray(pair_df, dtype=float)
        if df.shape != y.shape or not np.all(df > 0):
            raise ValueError(f"pooling: pair_df must give each of the {len(y)} pairs a df > 0, got {pair_df}")
    return y, v, names, df


def tau2_dl(y: np.ndarray, v: np.ndarray) -> np.ndarray:
    """DerSimonian-Laird's tau^2 over the last axis (one meta-analysis per row), floored at 0."""
    w = 1 / v
    s1, s2 = w.sum(-1), (w**2).sum(-1)
    mu = (w * y).sum(-1) / s1
    q = (w * (y - mu[..., None]) ** 2).sum(-1)
    return np.maximum(0.0, (q - (y.shape[-1] - 1)) / (s1 - s2 / s1))


def _reml_score(y: np.ndarray, v: np.ndarray, tau2: np.ndarray) -> np.ndarray:
    """Twice the REML score in tau^2, y'PPy - tr P, with P = W - w w' / sum w (so y'PPy =
    sum w^2 (y - mu)^2 and tr P = sum w - sum w^2 / sum w), over the last axis."""
    w = 1 / (v + tau2[..., None])
    s1 = w.sum(-1)
    mu = (w * y).sum(-1) / s1
    return (w**2 * (y - mu[..., None]) ** 2).sum(-1) - (s1 - (w**2).sum(-1) / s1)


def tau2_reml(y: np.ndarray, v: np.ndarray, rel_tol: float = 1e-13) -> np.ndarray:
    """REML tau^2 over the last axis (one meta-analysis per row): 0 where the score is <= 0 there,
    else the score's root by bisection between 0 and a bound where it is negative (doubled until it
    is). Bisection, not Fisher scoring: scoring crawls where the expected information is far above
    the observed one (unequal variances, P = 3: thousands of steps), and bisection cannot fail."""
    y, v = np.broadcast_arrays(np.asarray(y, dtype=float), np.asarray(v, dtype=float))
    positive = _reml_score(y, v, np.zeros(y.shape[:-1])) > 0
    hi = ((y - y.mean(-1, keepdims=True)) ** 2).sum(-1) + v.max(-1)
    for _ in range(200):
        up = positive & (_reml_score(y, v, hi) > 0)
        if not up.any():
            break
        hi = np.where(up, 2 * hi, hi)
    else:
        raise RuntimeError("pooling: no upper bound found for the REML tau^2")
    lo = np.zeros_like(hi)
    while np.any(positive & (hi - lo > rel_tol * hi)):
        mid = (lo + hi) / 2
        above = _reml_score(y, v, mid) > 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(positive, (lo + hi) / 2, 0.0)


def reml_loglik(tau2: float, y: np.ndarray, v: np.ndarray) -> float:
    """The restricted log-likelihood of tau^2, constants dropped: what `tau2_reml` maximises."""
    w = 1 / (v + tau2)
    mu = (w * y).sum() / w.sum()
    return float(-0.5 * (np.log(v + tau2).sum() + np.log(w.sum()) + (w * (y - mu) ** 2).sum()))


def tau2_of(y: np.ndarray, v: np.ndarray, method: Tau2Method) -> np.ndarray:
    if method not in TAU2_METHODS:
        raise ValueError(f"pooling: tau2_method must be one of {TAU2_METHODS}, got {method!r}")
    return tau2_reml(y, v) if method == "reml" else tau2_dl(y, v)


def pooled_test(y: np.ndarray, v: np.ndarray, tau2: np.ndarray, test: Test) -> tuple[np.ndarray, np.ndarray]:
    """(mu, se) over the last axis for the test's variance (module docstring); the reference
    distribution is a t with P-1 df for "hk_max1", "hk" and "t", the normal for "wald". "t" weighs
    every pair alike: the mean of the pairs' estimates and its standard error from their spread
    alone, the one-sample t-test on the estimates, which reads no within-pair variance (its size
    holds however badly a pair's few replicates estimate its own; docs/pooling.md)."""
    if test not in TESTS:
        raise ValueError(f"pooling: test must be one of {TESTS}, got {test!r}")
    if test == "t":
        return y.mean(-1), y.std(-1, ddof=1) / np.sqrt(y.shape[-1])
    w = 1 / (v + tau2[..., None])
    s1 = w.sum(-1)
    mu = (w * y).sum(-1) / s1
    q = (w * (y - mu[..., None]) ** 2).sum(-1) / (y.shape[-1] - 1)
    scale = {"hk_max1": np.maximum(1.0, q), "hk": q, "wald": np.ones_like(q)}[test]
    return mu, np.sqrt(scale / s1)


def critical(test: Test, df: int, alpha: float) -> float:
    """The two-sided critical value: t at df for the HK tests and "t", normal for "wald"."""
    return float(stats.norm.isf(alpha / 2) if test == "wald" else stats.t.isf(alpha / 2, df))


def _heterogeneity(y: np.ndarray, v: np.ndarray, tau2: float) -> tuple[float, float, float]:
    """(Q, its p, I^2 with Higgins and Thompson's typical within-pair variance)."""
    w = 1 / v
    s1, s2 = w.sum(), (w**2).sum()
    q = float((w * (y - (w * y).sum() / s1) ** 2).sum())
    typical = (len(y) - 1) * s1 / (s1**2 - s2)
    return q, float(stats.chi2.sf(q, len(y) - 1)), float(tau2 / (tau2 + typical))


def pool(
    estimates,
    variances,
    names=None,
    *,
    alpha: float = 0.05,
    tau2_method: Tau2Method = "reml",
    test: Test = "hk_max1",
    pair_df=None,
) -> Pooled:
    """The random-effects pooled effect of P >= 2 pairs (module docstring), with each pair's row.

    estimates, variances: per pair, d_k and v_k (its SE squared), both finite, v_k > 0. names: the
    pairs' distinct names (default "pair 0", ...). pair_df: each pair's own df for its row's CI
    (transfer_stats.effect's df), else the row's CI is normal. Raises ValueError on bad input and on
    one pair (nothing to pool: the report keeps that pair's own analysis)."""
    if not 0 < alpha < 1:
        raise ValueError(f"pooling: alpha must be in (0, 1), got {alpha}")
    y, v, names, pair_df = _checked(estimates, variances, names, pair_df)
    p = len(y)
    tau2 = float(tau2_of(y, v, tau2_method))
    mu, se = (float(x) for x in pooled_test(y, v, np.asarray(tau2), test))
    ci = p_value = None
    if se > 1e-9 * np.sqrt(1 / (1 / (v + tau2)).sum()):  # q of 0 up to rounding: the pairs agree exactly
        half = critical(test, p - 1, alpha) * se
        ci = (mu - half, mu + half)
        p_value = float(2 * (stats.norm.sf(abs(mu) / se) if test == "wald" else stats.t.sf(abs(mu) / se, p - 1)))
    q, q_p, i2 = _heterogeneity(y, v, tau2)
    w = 1 / (v + tau2)
    rows = []
    for k in range(p):
        crit_k = stats.norm.isf(alpha / 2) if pair_df is None else stats.t.isf(alpha / 2, pair_df[k])
        se_k = float(np.sqrt(v[k]))
        rows.append(
            PairRow(
                names[k],
                float(y[k]),
                se_k,
                (float(y[k] - crit_k * se_k), float(y[k] + crit_k * se_k)),
                float(w[k] / w.sum()),
            )
        )
    return Pooled(
        estimate=mu,
        se=se,
        ci=ci,
        p_value=p_value,
        df=p - 1,
        tau2=tau2,
        tau=float(np.sqrt(tau2)),
        i2=i2,
        q=q,
        q_p_value=q_p,
        n_pairs=p,
        pairs=tuple(rows),
        tau2_method=tau2_method,
        test=test,
        alpha=alpha,
    )


def mde(n_pairs: int, within_se: float, *, assumed_tau: float, power: float = 0.8) -> float:
    """The smallest true pooled effect a two-sided 5% test on P = n_pairs pairs detects with
    probability `power`, at an ASSUMED between-pair SD tau: delta x sqrt((s^2 + tau^2) / P), s the
    typical within-pair SE, delta the noncentrality at which a noncentral t with P-1 df exceeds
    t_0.975 with that probability (transfer_stats.power_noncentrality; not the normal shortcut).
    Treats the HK variance as if it were the true one: the max(1, q) floor only widens the interval,
    so the realised power is at or below `power` (docs/pooling.md measures it)."""
    if int(n_pairs) != n_pairs or n_pairs < 2:
        raise ValueError(f"mde: needs at least 2 pairs, got {n_pairs}")
    if not (np.isfinite(within_se) and within_se > 0):
        raise ValueError(f"mde: within_se must be finite and > 0, got {within_se}")
    if not (np.isfinite(assumed_tau) and assumed_tau >= 0):
        raise ValueError(f"mde: assumed_tau must be finite and >= 0, got {assumed_tau}")
    return power_noncentrality(n_pairs - 1, power) * float(np.sqrt((within_se**2 + assumed_tau**2) / n_pairs))


COMPARED = (("reml", "hk_max1"), ("reml", "hk"), ("dl", "wald"))  # the default, plain HK, the classic DL test


def simulate_rejection(
    within_se,
    *,
    tau: float,
    effect: float = 0.0,
    reps: int = 2000,
    seed: int = 0,
    within_df: float | None = None,
    methods=COMPARED,
) -> dict[str, float]:
    """The rejection rate of each (tau2_method, test) in `methods` at two-sided 5%, over `reps` sets
    of P = len(within_se) pairs drawn from the model: d_k = effect + u_k + e_k, u_k ~ N(0, tau^2),
    e_k ~ N(0, within_se_k^2). effect 0 (the default) gives the size, otherwise the power.
    within_df: the within-pair variances the test is handed are estimates, v_k chi^2_df / df (as
    transfer_stats.effect's are), instead of the true ones. Every repetition is analysed at once
    (rows of one array). Keys "reml/hk_max1", ...; fixed `seed`, so the figures repeat exactly."""
    se = np.asarray(within_se, dtype=float)
    if se.ndim != 1 or len(se) < 2 or not np.all(se > 0):
        raise ValueError(f"simulate_rejection: needs >= 2 within-pair SEs > 0, got {within_se}")
    rng = np.random.default_rng(seed)
    shape = (reps, len(se))
    y = effect + tau * rng.standard_normal(shape) + se * rng.standard_normal(shape)
    v = np.broadcast_to(se**2, shape)
    if within_df is not None:
        v = v * rng.chisquare(within_df, shape) / within_df
    rates, tau2 = {}, {}
    for method, test in methods:
        if method not in tau2:
            tau2[method] = tau2_of(y, v, method)
        mu, s = pooled_test(y, v, tau2[method], test)
        rates[f"{method}/{test}"] = float(np.mean(np.abs(mu) > critical(test, len(se) - 1, 0.05) * s))
    return rates
