"""The paired test's false-positive rate on real null arms: k control replicates trained alike, split in two.

    python bench/real_nulls.py --run-dir /tmp/real-nulls              # k = 10: 126 splits of 5 against 5 (6 min on 2 cores)
    python bench/real_nulls.py --run-dir /tmp/real-nulls --k 6        # 10 splits of 3 against 3: too few to tell 5% from 20%

The pipeline itself trains k replicates of one arm on the real tiny model (the default preset with
`arms: {control: {numbers: base}}`, `replicates: k`): k models that differ only in their seeds (the
numbers they sample, the order they train in), as an arm and its reference would if nothing
transferred. Every split of the k into two halves (unordered: C(k, k/2) / 2 of them) is then put
through the report's own test (jobs/stats/evidence.Evidence.compare, the halves paired replicate by
replicate in the order given), and a split is a false detection when its primary test (the preset's
`evaluate.primary_split` / `primary_metric`) has p < 0.05. The rate is printed with its Wilson
interval over splits; the splits share models, so they are not independent and that interval is
narrower than the truth. Every other (split, metric) is counted too, at raw p.

A rerun with the same --run-dir reuses the trained models (the pipeline's manifest) and only retests.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs.experiment.config import load_experiment  # noqa: E402
from jobs.phases.report import read_scores  # noqa: E402
from jobs.stats.accuracy import wilson_ci  # noqa: E402
from jobs.stats.evidence import SPLITS, Evidence  # noqa: E402
from jobs.stats.transfer_stats import METRICS  # noqa: E402


def halves(k: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every split of range(k) into two halves of k // 2, each once (the half holding 0 first)."""
    out = []
    for first in itertools.combinations(range(k), k // 2):
        if 0 in first:
            out.append((first, tuple(i for i in range(k) if i not in first)))
    return out


def test_split(scores: dict, primary: tuple[str, str], first, second) -> dict:
    """The report's comparison of one half against the other: every split's and metric's p-value."""
    models = [
        types.SimpleNamespace(arm=arm, name=f"control/{i}", teacher="teacher", base="base")
        for arm, half in (("A", first), ("B", second))
        for i in half
    ]
    result = Evidence(scores, models, primary).compare("A", "B")
    return {f"{split}/{metric}": result.cell(split, metric).p_value for split in SPLITS for metric in METRICS} | {
        "paired": result.primary.paired
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--k", type=int, default=10, help="replicates trained alike (even, at least 6)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args()
    if args.k < 6 or args.k % 2:
        parser.error("--k must be even and at least 6 (two halves of at least 3 replicates)")
    overrides = ["arms={control: {numbers: base}}", f"replicates={args.k}"]
    command = [sys.executable, str(ROOT / "jobs" / "pipeline.py"), "--run-dir", args.run_dir]
    done = subprocess.run([*command, *(x for o in overrides for x in ("--set", o))], cwd=ROOT)
    if done.returncode:
        return done.returncode
    cfg = load_experiment(None, overrides)
    primary = (cfg.evaluate.primary_split, cfg.evaluate.primary_metric)
    run_dir = Path(args.run_dir)
    scores = {
        name: read_scores(run_dir, name) for name in ["base", "teacher", *(f"control/{i}" for i in range(args.k))]
    }
    tests = [test_split(scores, primary, first, second) for first, second in halves(args.k)]
    key = "/".join(primary)
    rates = {}
    for name in tests[0]:
        if name == "paired":
            continue
        ps = [t[name] for t in tests if t[name] is not None]
        hits = sum(p < 0.05 for p in ps)
        rates[name] = {
            "detections": hits,
            "splits": len(ps),
            "rate": hits / len(ps) if ps else None,
            "wilson95": wilson_ci(hits, len(ps)),
        }
    print("| test | detections | splits | rate | Wilson 95% (splits not independent) |\n|---|---|---|---|---|")
    for name, r in sorted(rates.items(), key=lambda item: item[0] != key):
        rate = "-" if r["rate"] is None else f"{r['rate']:.3f}"
        print(
            f"| {name}{' (primary)' if name == key else ''} | {r['detections']} | {r['splits']} | {rate} | {r['wilson95'][0]:.3f}-{r['wilson95'][1]:.3f} |"
        )
    summary = {
        "k": args.k,
        "primary": key,
        "paired": all(t["paired"] for t in tests),
        "rates": rates,
        "p_values": tests,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
