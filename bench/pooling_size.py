"""The size and power of the pooled random-effects test over P teacher–sham pairs, simulated.

    python bench/pooling_size.py               # 20,000 repetitions a row (Monte Carlo SE of a 5% rate: 0.15 points)
    python bench/pooling_size.py --reps 2000   # what tests/jobs/stats/test_pooling.py runs

Each row draws `reps` sets of P pair estimates from the model of jobs/stats/pooling.py,
d_k = effect + u_k + e_k, u_k ~ N(0, tau^2), e_k ~ N(0, se_k^2), and prints the rejection rate
at two-sided 5% of: the max(1, q) corrected Hartung-Knapp test on REML's tau^2 (the default),
plain Hartung-Knapp on REML's tau^2, and DerSimonian-Laird on the normal (the classic test).

Within-pair SEs: `equal` 0.015 each; `mixed` 0.013 and 0.017 alternating (the registered pair's
SE and the null-sham run's, issue 69); `spread` from 0.005 to 0.05 in equal ratios (a tenfold
range, the hard case for HK). `known`: the test is handed the true variances; `df N`: estimates,
v_k chi^2_N / N, as transfer_stats.effect's are at N df (46: the registered run's 48 cue clusters;
5 and 2: what few replicates per pair can leave). The power table sets the true effect to
`mde(P, 0.015, assumed_tau=tau)` and draws pairs at that tau (mixed SEs, variances known).
docs/pooling.md prints this script's output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # run as `python bench/pooling_size.py`

from jobs.stats.pooling import COMPARED, mde, simulate_rejection  # noqa: E402

TYPICAL_SE = 0.015
TAUS = (0.0, 0.0075, 0.015, 0.045)  # none, half, one and three times the typical within SE


def within_ses(pattern: str, pairs: int) -> list[float]:
    if pattern == "equal":
        return [TYPICAL_SE] * pairs
    if pattern == "mixed":
        return [(0.013, 0.017)[k % 2] for k in range(pairs)]
    return list(np.geomspace(0.005, 0.05, pairs))


def row(cells: list, rates: dict) -> str:
    return "| " + " | ".join([*map(str, cells), *(f"{100 * rates[f'{m}/{t}']:.2f}%" for m, t in COMPARED)]) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    header = "| corrected HK (REML) | plain HK (REML) | DL, normal |\n"
    print(f"Size: rejection rate at 5% under the null, {args.reps} repetitions a row, seed {args.seed}\n")
    print("| P | tau | within SEs | within variances " + header + "|---|---|---|---|---|---|---|")
    for pairs in (3, 6, 10):
        for pattern in ("equal", "mixed", "spread"):
            for tau in TAUS:
                rates = simulate_rejection(within_ses(pattern, pairs), tau=tau, reps=args.reps, seed=args.seed)
                print(row([pairs, tau, pattern, "known"], rates))
    for df in (46, 5, 2):
        for tau in (0.0, TYPICAL_SE):
            rates = simulate_rejection(within_ses("mixed", 6), tau=tau, reps=args.reps, seed=args.seed, within_df=df)
            print(row([6, tau, "mixed", f"df {df}"], rates))
    print(
        f"\nPower at the MDE (true effect = mde(P, {TYPICAL_SE}, assumed_tau=tau), drawn at that tau, mixed SEs, variances known)\n"
    )
    print("| P | tau | MDE " + header + "|---|---|---|---|---|---|")
    for pairs in (3, 6, 10):
        for tau in (0.0, TYPICAL_SE):
            effect = mde(pairs, TYPICAL_SE, assumed_tau=tau)
            rates = simulate_rejection(
                within_ses("mixed", pairs), tau=tau, effect=effect, reps=args.reps, seed=args.seed + 1
            )
            print(row([pairs, tau, f"{effect:.4f}"], rates))


if __name__ == "__main__":
    main()
