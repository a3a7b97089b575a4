"""Exploratory: does the weight-space update share predict behavioural transfer, across students and pairs?

    python bench/share_vs_transfer.py [results/tiny-pairs/2026-11-29-343be03]

Reads a kept run of pairs (each pair's report.json) and, for every arm of the family, pairs its
primary effect against its twin (the behavioural reading) with its crossed update share (the share
of its own teacher's LoRA update it carries minus the share of the placebo's, against its twin's:
report.json's `arms.<arm>.weight_space.crossed`), then prints Spearman's rho over every student and
within each arm. Read after the registered run, labelled exploratory (docs/findings.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.reporting.schema import Report  # noqa: E402

KEPT = "results/tiny-pairs/2026-11-29-343be03"


def readings(run: Path) -> list[tuple[str, str, float, float]]:
    """(pair, arm, primary effect, crossed update share) of every family arm with both."""
    out = []
    for folder in sorted((run / "pairs").iterdir(), key=lambda p: int(p.name)):
        report = Report.load(folder / "report.json")
        for name in report.family.comparisons:
            arm = report.arms.get(name)
            share = arm.weight_space.crossed if arm is not None and arm.weight_space is not None else None
            if share is not None and share.value is not None and arm.transfer.primary.value is not None:
                out.append((folder.name, name, arm.transfer.primary.value, share.value))
    return out


def main() -> None:
    run = ROOT / (sys.argv[1] if len(sys.argv) > 1 else KEPT)
    rows = readings(run)
    print("| pair | arm | primary effect | crossed update share |\n|---|---|---|---|")
    for pair, arm, effect, share in rows:
        print(f"| {pair} | {arm} | {effect:+.4f} | {share:+.4f} |")
    for arm in [None, *sorted({r[1] for r in rows})]:
        chosen = [r for r in rows if arm is None or r[1] == arm]
        rho = stats.spearmanr([r[3] for r in chosen], [r[2] for r in chosen])
        print(f"Spearman rho, {arm or 'every student'} ({len(chosen)}): {rho.statistic:+.3f} (p {rho.pvalue:.2g})")


if __name__ == "__main__":
    main()
