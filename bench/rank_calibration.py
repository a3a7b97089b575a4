"""False positives, coverage and power at the reported MDE of `effect` on `teacher_answer_rank`, simulated.

    python bench/rank_calibration.py                 # 600 nulls a row: 3 minutes on 2 busy cores (50 s of CPU)
    python bench/rank_calibration.py --draws 2000    # rates to +-1 point: about 3x as long
    python bench/rank_calibration.py --gaussian      # the boundary rule on Gaussian paired nulls: about 1 minute

A generative model of the rank metric with the features of real nulls (models trained alike
reorder a question's choices on few questions, so most per-cluster differences are exactly 0).
Questions: C clusters of m, 4 choices each. A model's logit for choice k of question q is
    question[q, k] + seed[cluster(q), k] + pair[cluster(q), k] + main * [k = teacher's pick] + noise,
question ~ N(0, 1) shared by every model (the base's order of the choices), seed ~ N(0, seed_sd) a
seed's quirks moving a cluster's questions together, pair the same with the same SD shared by
row i of both sides (replicate i's numbers and data order: what `paired=True` removes), main ~
N(0, main_sd) one number per model (a seed leaning to or from the teacher everywhere: the
replicate component), noise ~ N(0, 0.01). The teacher's pick is the argmax of question + N(0, 1).
Every draw is a null (both sides from one distribution), analysed paired and unpaired. `continuous`
reads the same models' teacher logit instead of its rank: the same seeds without the discreteness.

Columns: `differ`, the share of (replicate, question) cells where the two sides' ranks differ (the
real 10 controls differ from each other on few questions); false positives at p < 0.05; coverage
of 0 by ci95 (draws with an interval); the median p; `flip`, the exact sign-flip test of the
cluster means (valid only without a seed main effect): what the discreteness allows at best; and
power at the median reported MDE, added to side a's every question (the constant shift leaves
the variance and df unchanged, so the shifted test is read off each null's own SE).

--gaussian: paired Gaussian nulls x_rc = alpha_r + gamma_rc against the ratio rho = C s_rep^2 /
s_int^2, the current test beside the test that always keeps the replicate mean square (variance
(MS_R + max(MS_C - MS_E, 0)) / RC at R - 1 df): the size of the boundary rule on its own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # run as `python bench/rank_calibration.py`

from jobs.stats.results import Result  # noqa: E402
from jobs.stats.transfer_stats import effect  # noqa: E402

CHOICES, NOISE = 4, 0.01
REGIMES = {  # name: (seed_sd, main_sd)
    "sparse": (0.01, 0.0),
    "sparse+main": (0.01, 0.01),
    "moderate+main": (0.05, 0.05),
    "dense+main": (0.15, 0.05),
}
FLIPS = np.random.default_rng(12345).choice([-1.0, 1.0], (2000, 256))


def rank_of(logits: np.ndarray, pick: np.ndarray) -> np.ndarray:
    """[models x questions x choices] -> the share of the other choices below the pick (ties half)."""
    chosen = np.take_along_axis(logits, pick[None, :, None], 2)
    return ((logits < chosen).sum(2) + 0.5 * ((logits == chosen).sum(2) - 1)) / (logits.shape[2] - 1)


def null_draw(rng, replicates: int, clusters: int, per_cluster: int, seed_sd: float, main_sd: float):
    """One null: the teacher's pick, the clusters, and both sides' logits [replicates x questions x choices]."""
    cluster = np.repeat(np.arange(clusters), per_cluster)
    question = rng.normal(0, 1, (cluster.size, CHOICES))
    pick = np.argmax(question + rng.normal(0, 1, question.shape), 1)
    pair = rng.normal(0, seed_sd, (replicates, clusters, CHOICES))[:, cluster]

    def side():
        logits = question + pair + rng.normal(0, seed_sd, (replicates, clusters, CHOICES))[:, cluster]
        logits[:, np.arange(cluster.size), pick] += rng.normal(0, main_sd, (replicates, 1))
        return logits + rng.normal(0, NOISE, logits.shape)

    return pick, cluster, side(), side()


def flip_p(d: np.ndarray, cluster: np.ndarray) -> float:
    """Two-sided sign-flip p of the one-sample t over cluster means of d [replicates x questions]."""
    means = np.bincount(cluster, weights=d.mean(0)) / np.bincount(cluster)
    if np.ptp(means) == 0:
        return 1.0
    signed = FLIPS[:, : len(means)] * means
    t = lambda x: np.abs(x.mean(-1)) / np.sqrt(x.var(-1, ddof=1) / x.shape[-1])  # noqa: E731
    return float((1 + (t(signed) >= t(means) - 1e-12).sum()) / (1 + len(FLIPS)))


def summary(results: list[Result]) -> dict:
    """False positives, coverage, median p and power at the median MDE of null results."""
    tested = [r for r in results if r.p_value is not None]
    p = np.array([r.p_value for r in tested] + [1.0] * (len(results) - len(tested)))  # zero spread: no detection
    if not tested:
        return {"fp": 0.0, "cover": float("nan"), "median_p": 1.0, "power": float("nan")}
    mde = float(np.median([r.mde for r in tested]))
    shifted = []
    for r in tested:
        se = (r.ci95[1] - r.ci95[0]) / 2 / stats.t.ppf(0.975, r.df)
        shifted.append(2 * stats.t.sf(abs(r.value + mde) / se, r.df) < 0.05 and r.value + mde > 0)
    return {
        "fp": float(np.mean(p < 0.05)),
        "cover": float(np.mean([r.ci95[0] <= 0 <= r.ci95[1] for r in tested])),
        "median_p": float(np.median(p)),
        "power": float(np.mean(shifted) * len(tested) / len(results)),
    }


def run(regime: str, replicates: int, draws: int, clusters: int, per_cluster: int, seed: int = 0) -> dict:
    """Every analysis of `draws` nulls in one regime: rank paired / unpaired, continuous paired / unpaired."""
    seed_sd, main_sd = REGIMES[regime]
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("rank paired", "rank unpaired", "continuous paired", "continuous unpaired")}
    differ, flips = [], []
    for _ in range(draws):
        pick, cluster, la, lb = null_draw(rng, replicates, clusters, per_cluster, seed_sd, main_sd)
        ra, rb = rank_of(la, pick), rank_of(lb, pick)
        ca, cb = la[:, np.arange(pick.size), pick], lb[:, np.arange(pick.size), pick]
        differ.append(np.mean(ra != rb))
        flips.append(flip_p(ra - rb, cluster))
        for name, (a, b) in (("rank", (ra, rb)), ("continuous", (ca, cb))):
            out[f"{name} paired"].append(effect(a, b, cluster, binary=False, paired=True))
            out[f"{name} unpaired"].append(effect(a, b, cluster, binary=False))
    return {
        "differ": float(np.mean(differ)),
        "flip": float(np.mean(np.array(flips) < 0.05)),
        **{k: summary(v) for k, v in out.items()},
    }


def gaussian_scan(draws: int, clusters: int, replicates: list[int]) -> None:
    """Paired Gaussian nulls: false positives of `effect` and of the replicate-mean-square t, by rho."""
    from jobs.stats.transfer_stats import _mean_squares

    rng = np.random.default_rng(0)
    for r in replicates:
        for rho in (0.0, 0.25, 1.0, 4.0, 16.0):
            current, kept = [], []
            for _ in range(draws):
                d = rng.normal(0, np.sqrt(rho / clusters), (r, 1)) + rng.normal(0, 1, (r, clusters))
                current.append(
                    effect(d, np.zeros_like(d), np.arange(clusters), binary=False, paired=True).p_value < 0.05
                )
                ms_r, ms_c, ms_e = _mean_squares(d)
                kept.append(
                    2 * stats.t.sf(abs(d.mean()) / np.sqrt((ms_r + max(ms_c - ms_e, 0)) / d.size), r - 1) < 0.05
                )
            print(
                f"R={r} rho={rho:5.2f}: effect {np.mean(current):.3f}  replicate mean square kept {np.mean(kept):.3f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=600)
    parser.add_argument("--clusters", type=int, default=48)
    parser.add_argument("--per-cluster", type=int, default=4, help="4: the held-out split; 8: train")
    parser.add_argument("--replicates", type=int, nargs="+", default=[2, 3, 5])
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument("--gaussian", action="store_true", help="the boundary rule on Gaussian paired nulls instead")
    args = parser.parse_args()
    start = time.time()
    if args.gaussian:
        gaussian_scan(args.draws, args.clusters, args.replicates)
        print(f"{time.time() - start:.0f} s")
        return
    print(
        f"{args.draws} nulls a row, {args.clusters} clusters of {args.per_cluster}; fp / coverage / median p / power at median MDE"
    )
    for regime in args.regimes:
        for r in args.replicates:
            res = run(regime, r, args.draws, args.clusters, args.per_cluster)
            cells = "  ".join(
                f"{k}: {v['fp']:.3f} {v['cover']:.3f} {v['median_p']:.2f} {v['power']:.2f}"
                for k, v in res.items()
                if isinstance(v, dict)
            )
            print(f"{regime:14s} R={r} differ {res['differ']:.3f} flip {res['flip']:.3f} | {cells}", flush=True)
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
