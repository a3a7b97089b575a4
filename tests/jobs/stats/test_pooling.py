"""jobs/stats/pooling.py against outside references and against its own model:

- a published worked example, the BCG vaccine trials (metafor's dat.bcg, log risk ratios): Cochran's
  Q 152.2330 and DerSimonian-Laird's pooled -0.7141 (-1.0644 to -0.3638), as metafor's tests check
  them against Stata's metan; REML's I^2 0.9222139 (metafor, as easystats' performance tests read it);
- statsmodels' combine_effects on random data: DerSimonian-Laird's tau^2, the pooled estimate and its
  normal SE, Cochran's Q and its p, the plain Hartung-Knapp variance (its `var_hksj_re`, on a t with
  P-1 df: `conf_int(use_t=True)`) and the max(1, q) variance as the larger of that and 1 / sum w;
  its Paule-Mandel tau^2 where REML's must equal it (equal within-pair variances);
- REML's tau^2 against a direct maximisation of the restricted likelihood;
- the size of each test by simulation (2,000 repetitions a scenario, fixed seeds).

Measured here (seed 0, 2,000 repetitions a scenario; docs/pooling.md has 20,000): with the
within-pair variances known, the max(1, q) corrected HK test is conservative where pairs differ
little: at P = 6, 0.55% (equal SEs) and 0.45% (mixed) at tau = 0, 1.95% and 2.2% at tau = the
within SE; at P = 3 0.0% to 0.05%; at P = 10 2.2% to 2.35%, then 4.4% and 4.2%. Outside the
issue's 3-7% at P = 6: a finding, not tuned (`test_the_issues_acceptance_for_corrected_hk`, a strict
xfail, keeps it visible). Plain HK holds 4.45% to 5.9% in the same twelve scenarios; DerSimonian-
Laird on the normal 2.85% to 10.6%. Power at the MDE (P = 6, mixed SEs, tau = assumed tau = the
within SE, seed 5): plain HK 80.2%, corrected 79.4%.
"""

import math

import numpy as np
import pytest
from scipy import optimize, stats
from statsmodels.stats.meta_analysis import combine_effects

from jobs.stats.pooling import TESTS, mde, pool, reml_loglik, simulate_rejection, tau2_dl, tau2_reml

# The BCG vaccine trials: vaccinated TB cases and non-cases, then the controls' (metafor's dat.bcg).
TPOS = [4, 6, 3, 62, 33, 180, 8, 505, 29, 17, 186, 5, 27]
TNEG = [119, 300, 228, 13536, 5036, 1361, 2537, 87886, 7470, 1699, 50448, 2493, 16886]
CPOS = [11, 29, 11, 248, 47, 372, 10, 499, 45, 65, 141, 3, 29]
CNEG = [128, 274, 209, 12619, 5761, 1079, 619, 87892, 7232, 1600, 27197, 2338, 17825]

SE_EQUAL, SE_MIXED = 0.015, (0.013, 0.017)  # the project's measured within-pair SEs: 0.013 registered, 0.017 null sham
REPS = 2000


def bcg() -> tuple[np.ndarray, np.ndarray]:
    """Log risk ratios and their variances, as metafor's escalc(measure="RR") computes them."""
    a, b, c, d = (np.array(x, dtype=float) for x in (TPOS, TNEG, CPOS, CNEG))
    return np.log(a / (a + b)) - np.log(c / (c + d)), 1 / a - 1 / (a + b) + 1 / c - 1 / (c + d)


def random_sets(n: int, seed: int):
    """n meta-analyses of 2 to 12 pairs, within SEs spread over a factor up to 10, tau 0 to 2x the SE."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        p = int(rng.integers(2, 13))
        se = 0.015 * np.exp(rng.uniform(-1.15, 1.15, p))
        yield (
            rng.normal(0.01, 0.03 * rng.uniform(0, 1))
            + rng.uniform(0, 0.03) * rng.standard_normal(p)
            + se * rng.standard_normal(p),
            se**2,
        )


def scenarios(pairs: tuple[int, ...]):
    """(label, within SEs, tau): tau 0 and tau the typical within SE, equal and mixed SEs."""
    for p in pairs:
        for tau in (0.0, SE_EQUAL):
            yield f"P={p} tau={tau} equal", [SE_EQUAL] * p, tau
            yield f"P={p} tau={tau} mixed", [SE_MIXED[k % 2] for k in range(p)], tau


def test_the_bcg_worked_example():
    y, v = bcg()
    dl = pool(y, v, tau2_method="dl", test="wald")
    assert dl.q == pytest.approx(152.2330, abs=1e-4) and dl.df == 12
    assert dl.estimate == pytest.approx(-0.7141, abs=1e-4)
    assert dl.ci == pytest.approx((-1.0644, -0.3638), abs=1e-4)
    reml = pool(y, v)
    assert reml.i2 == pytest.approx(0.9222139, abs=1e-6)
    assert reml.tau == pytest.approx(math.sqrt(reml.tau2)) and reml.n_pairs == 13


# statsmodels' own, at its negative tau^2
@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")
def test_dersimonian_laird_and_the_hk_variances_match_statsmodels():
    checked = 0
    for y, v in random_sets(300, seed=1):
        ref = combine_effects(y, v, method_re="dl")
        if ref.tau2 < 0:  # statsmodels leaves DL's tau^2 negative when Q < P-1; ours is floored at 0
            assert tau2_dl(y, v) == 0
            continue
        checked += 1
        wald, hk, hk_max1 = (pool(y, v, tau2_method="dl", test=t) for t in ("wald", "hk", "hk_max1"))
        assert wald.tau2 == pytest.approx(ref.tau2, rel=1e-9, abs=1e-15)
        assert wald.estimate == pytest.approx(ref.mean_effect_re, rel=1e-9, abs=1e-15)
        assert wald.se == pytest.approx(ref.sd_eff_w_re, rel=1e-9)
        assert hk.se == pytest.approx(ref.sd_eff_w_re_hksj, rel=1e-9)
        assert hk.ci == pytest.approx(tuple(ref.conf_int(use_t=True)[3]), rel=1e-9, abs=1e-15)
        assert hk_max1.se == pytest.approx(max(ref.sd_eff_w_re_hksj, ref.sd_eff_w_re), rel=1e-9)
        assert wald.q == pytest.approx(ref.q, rel=1e-9) and wald.q_p_value == pytest.approx(
            ref.test_homogeneity().pvalue, rel=1e-9, abs=1e-300
        )
        # DL's tau^2 in Higgins-Thompson's I^2
        assert wald.i2 == pytest.approx(max(0.0, (ref.q - wald.df) / ref.q), abs=1e-12)
    assert checked > 100


def test_reml_equals_paule_mandel_when_the_variances_are_equal():
    """With equal v both solve sum (y - mean)^2 / (v + tau^2) = P - 1, floored at 0."""
    rng = np.random.default_rng(2)
    for _ in range(100):
        p = int(rng.integers(2, 12))
        y, v = rng.normal(0, 0.02, p), np.full(p, rng.uniform(0.01, 0.03) ** 2)
        # statsmodels' default atol (1e-5 on the estimating equation, about that relative to v + tau^2):
        # a tighter one can end on a rounding-negative step, which its iteration takes for "below 0" and returns 0
        ref = combine_effects(y, v, method_re="pm")
        ours = float(tau2_reml(y, v))
        assert ours == pytest.approx(ref.tau2, abs=1e-4 * (v[0] + ours))
        assert ours == pytest.approx(max(0.0, np.var(y, ddof=1) - v[0]), rel=1e-9, abs=1e-15)  # the closed form


def test_reml_is_the_maximum_of_the_restricted_likelihood():
    for y, v in random_sets(300, seed=3):
        ours = float(tau2_reml(y, v))
        top = 50 * (np.var(y) + v.max())
        grid = np.concatenate([[0.0], np.geomspace(1e-9, top, 400)])
        start = grid[np.argmax([reml_loglik(t, y, v) for t in grid])]
        direct = optimize.minimize_scalar(
            lambda t, y, v: -reml_loglik(t, y, v),
            args=(y, v),
            bounds=(0, max(2 * start, 1e-9)),
            method="bounded",
            options={"xatol": 1e-14},
        )
        best = max(reml_loglik(direct.x, y, v), reml_loglik(0.0, y, v))
        assert reml_loglik(ours, y, v) >= best - 1e-9, (y, v, ours, direct.x)


def test_rows_weights_and_pair_intervals():
    y, v = np.array([0.05, 0.02, 0.08]), np.array([0.013, 0.017, 0.015]) ** 2
    result = pool(y, v, ["a", "b", "c"], pair_df=[46, 30, 10], alpha=0.1)
    assert [row.name for row in result.pairs] == ["a", "b", "c"]
    assert sum(row.weight for row in result.pairs) == pytest.approx(1.0)
    c = result.pairs[2]
    assert c.ci == pytest.approx((0.08 - stats.t.isf(0.05, 10) * 0.015, 0.08 + stats.t.isf(0.05, 10) * 0.015))
    assert result.ci[1] - result.estimate == pytest.approx(stats.t.isf(0.05, 2) * result.se)
    w = 1 / (v + result.tau2)
    assert result.estimate == pytest.approx((w * y).sum() / w.sum())
    normal = pool(y, v).pairs[0]
    assert normal.ci == pytest.approx((0.05 - 1.959964 * 0.013, 0.05 + 1.959964 * 0.013), abs=1e-6)
    assert result.to_dict()["pairs"][0]["name"] == "a"


def test_pairs_that_agree_exactly():
    """q = 0: plain HK has no interval or p (never p = 0); the max(1, q) floor keeps 1 / sum w."""
    y, v = np.full(4, 0.03), np.full(4, 0.015**2)
    assert pool(y, v, test="hk").ci is None and pool(y, v, test="hk").p_value is None
    floored = pool(y, v)
    assert floored.tau2 == 0 and floored.i2 == 0 and floored.se == pytest.approx(0.015 / 2)


@pytest.mark.parametrize(
    ("estimates", "variances", "kwargs", "message"),
    [
        ([], [], {}, "no pairs"),
        ([0.05], [0.0002], {}, "one pair cannot be pooled"),
        ([0.05, 0.02], [0.0002], {}, "2 estimates but 1 variances"),
        ([0.05, 0.02], [0.0002, -0.0001], {}, "finite and > 0"),
        ([0.05, 0.02], [0.0002, 0.0], {}, "finite and > 0"),
        ([0.05, 0.02], [0.0002, float("nan")], {}, "finite and > 0"),
        ([0.05, float("inf")], [0.0002, 0.0002], {}, "estimates must be finite"),
        ([0.05, 0.02], [0.0002, 0.0002], {"names": ["a", "a"]}, "distinct pair names"),
        ([0.05, 0.02], [0.0002, 0.0002], {"names": ["a"]}, "distinct pair names"),
        ([0.05, 0.02], [0.0002, 0.0002], {"test": "z"}, "test must be one of"),
        ([0.05, 0.02], [0.0002, 0.0002], {"tau2_method": "pm"}, "tau2_method must be one of"),
        ([0.05, 0.02], [0.0002, 0.0002], {"alpha": 1.5}, "alpha must be in"),
        ([0.05, 0.02], [0.0002, 0.0002], {"pair_df": [3]}, "pair_df"),
    ],
)
def test_bad_input_is_named(estimates, variances, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pool(estimates, variances, **kwargs)


def test_mde_is_the_noncentral_t_power_point():
    for pairs, tau in ((6, 0.0), (6, 0.015), (10, 0.03)):
        value = mde(pairs, 0.015, assumed_tau=tau)
        se = math.sqrt((0.015**2 + tau**2) / pairs)
        assert stats.nct.sf(stats.t.isf(0.025, pairs - 1), pairs - 1, value / se) == pytest.approx(0.8, abs=1e-6)
    assert mde(6, 0.015, assumed_tau=0.015) > mde(6, 0.015, assumed_tau=0.0) > mde(10, 0.015, assumed_tau=0.0)
    with pytest.raises(TypeError):
        mde(6, 0.015, 0.01)  # the assumed tau is named, never positional
    for bad in (
        {"n_pairs": 1, "within_se": 0.015, "assumed_tau": 0},
        {"n_pairs": 6, "within_se": 0, "assumed_tau": 0},
        {"n_pairs": 6, "within_se": 0.015, "assumed_tau": -1},
    ):
        with pytest.raises(ValueError):
            mde(**bad)


def test_corrected_hk_is_never_liberal_and_plain_hk_holds_its_size():
    """Variances known: the default never rejects above 7% in these scenarios, and plain HK sits in 3-7%."""
    rates = {label: simulate_rejection(se, tau=tau, reps=REPS, seed=0) for label, se, tau in scenarios((3, 6, 10))}
    assert all(r["reml/hk_max1"] <= 0.07 for r in rates.values()), rates
    assert all(0.03 <= r["reml/hk"] <= 0.07 for r in rates.values()), rates
    assert all(r["reml/hk_max1"] <= r["reml/hk"] for r in rates.values())  # the floor only widens


@pytest.mark.xfail(
    strict=True,
    reason="finding: with known within-pair variances the max(1, q) HK test is conservative at P = 6 (0.5-1% at tau = 0, 2-3% at tau = the within SE): docs/pooling.md",
)
def test_the_issues_acceptance_for_corrected_hk():
    """Issue 69's acceptance as written: the max(1, q) HK test within 3-7% at P = 6, tau 0 and the within SE, equal and mixed SEs."""
    rates = {
        label: simulate_rejection(se, tau=tau, reps=REPS, seed=0)["reml/hk_max1"] for label, se, tau in scenarios((6,))
    }
    assert all(0.03 <= r <= 0.07 for r in rates.values()), rates


def test_power_at_the_mde():
    """A true effect of the MDE is detected near 80% by plain HK (the noncentral t's assumption) and no more by the corrected test."""
    se = [SE_MIXED[k % 2] for k in range(6)]
    rates = simulate_rejection(se, tau=SE_EQUAL, effect=mde(6, SE_EQUAL, assumed_tau=SE_EQUAL), reps=REPS, seed=5)
    assert 0.75 <= rates["reml/hk"] <= 0.85, rates
    assert rates["reml/hk_max1"] <= rates["reml/hk"]


def test_with_poorly_estimated_within_variances_only_the_t_on_the_estimates_holds_its_size():
    """Pairs of 2 replicates estimate their own SEs on about 2 df (the pilot's pairs: 1.6 to 14).
    Handed such estimates, both HK tests reject too often at P = 6 (a finding: plain HK 9-11%, the
    corrected one 6-7%); the pairs weighed alike, the t on their estimates, reads no within-pair SE
    and holds 3-7%, with the pairs' true SEs equal (as a balanced design makes them) or mixed."""
    methods = (("reml", "hk"), ("reml", "hk_max1"), ("reml", "t"))
    for label, se, tau in scenarios((6,)):
        rates = simulate_rejection(se, tau=tau, within_df=2, reps=REPS, seed=0, methods=methods)
        assert 0.03 <= rates["reml/t"] <= 0.07, (label, rates)
        assert rates["reml/hk"] > 0.07, (label, rates)


def test_simulation_input():
    assert set(simulate_rejection([0.01, 0.02], tau=0.0, reps=50)) == {"reml/hk_max1", "reml/hk", "dl/wald"}
    assert set(TESTS) == {"hk_max1", "hk", "wald", "t"}
    with pytest.raises(ValueError, match="within-pair SEs"):
        simulate_rejection([0.01], tau=0.0)
