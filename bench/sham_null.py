"""The registered test's own null: students of two more matched shams, read as the verdict reads.

    python bench/sham_null.py [--root ~/subliminal-runs/sham-null] [--analyse-only]   # about 30 min on 2 cores

The registered test (configs/tiny-confirm.yaml) compares the logit-KL student of the teacher
with its twin distilled from the matched sham, crossed on the train `teacher_answer_rank`: half
the two sides' difference toward the teacher's picks plus half their difference toward the
sham's. Its false-positive rate was simulated (bench/rank_calibration.py) and measured on
re-split SFT controls (bench/real_nulls.py), not on models of its own kind. Here two more matched
shams (world.null_sham_facts: facts that are neither the true answers nor the registered sham's,
shown among the choices equally often) are trained exactly as the registered sham is, and each
gets the registered dose and replicates of logit-KL students (bench/presets/sham-null.yaml: 8
paired replicates, 300 steps). Neither null sham knows the teacher's facts or the registered
sham's, and the two are exchangeable, so their students compared as the verdict compares the
teacher's and the sham's (`Evidence.compare`, teacher and registered sham as the two pick sets) is
a true null of the verdict's own kind: same models, same dose, same pairing, same test.

Declared before the runs (this file is committed before it is first run):
- primary: crossed, train, teacher_answer_rank, null sham 1's students against null sham 2's;
  expected within noise (p >= 0.05 with probability 0.95 if the test holds its size), its
  |value| below the registered effect (+0.0505) and near the registered design's MDE or under;
- also read: every split and side-by-side metric toward the teacher, toward the registered sham,
  and crossed (24 correlated tests; about 1 in 20 below 0.05 if calibrated);
- exploratory: transfer with other facts. The same students crossed toward the two null shams'
  own picks. A null sham's word is among a question's choices on about a third of the T
  questions, so an effect of the registered size would be diluted toward a third of it.

Three pipeline runs, each in a directory copied from the one before (the data and the teacher are
made once): sham_teacher.kind null1 (8 students), null2 (8 students), then matched with one
replicate (the registered sham, for its picks). Writes bench/results/sham_null.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))

PRESET = ROOT / "bench" / "presets" / "sham-null.yaml"
ARM = "student_logits_sham"
RUNS = (
    ("null1", ["sham_teacher.kind=null1"]),
    ("null2", ["sham_teacher.kind=null2"]),
    ("registered", ["replicates=1"]),
)
OUT = ROOT / "bench" / "results" / "sham_null.json"


def run_pipelines(root: Path) -> None:
    """The three runs, in order; each directory starts as a copy of the one before, so only the sham and what follows it are made again."""
    previous = None
    for folder, overrides in RUNS:
        run_dir = root / folder
        if previous is not None and not run_dir.exists():
            shutil.copytree(previous, run_dir, ignore=shutil.ignore_patterns(".lock", "report.*"))
        command = [
            sys.executable,
            str(ROOT / "jobs" / "pipeline.py"),
            "--config",
            str(PRESET),
            "--run-dir",
            str(run_dir),
        ]
        command += [arg for o in overrides for arg in ("--set", o)]
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True, cwd=ROOT)
        previous = run_dir


def scores_of(root: Path, replicates: int) -> tuple[dict[str, list[dict]], list[SimpleNamespace]]:
    """Every model's per-question scores under the names the verdict reads: base, teacher,
    sham_teacher (the registered sham), and the null shams' students as arms null_1 and null_2
    (as if students of the teacher: the verdict's reading of an arm of the teacher); plus the null
    shams themselves as null_sham_1 and null_sham_2."""
    from jobs.phases.report import read_scores

    one, two, registered = (root / folder for folder, _ in RUNS)
    scores = {
        "base": read_scores(one, "base"),
        "teacher": read_scores(one, "teacher"),
        "sham_teacher": read_scores(registered, "sham_teacher"),
    }
    scores |= {"null_sham_1": read_scores(one, "sham_teacher"), "null_sham_2": read_scores(two, "sham_teacher")}
    if read_scores(two, "teacher") != scores["teacher"] or read_scores(registered, "teacher") != scores["teacher"]:
        raise SystemExit("the three runs do not share one teacher: rerun from an empty --root")
    models = []
    for arm, run_dir in (("null_1", one), ("null_2", two)):
        for i in range(replicates):
            scores[f"{arm}/{i}"] = read_scores(run_dir, f"{ARM}/{i}")
            models.append(SimpleNamespace(arm=arm, name=f"{arm}/{i}", teacher="teacher", base="base"))
    return scores, models


def pick_rates(scores: dict[str, list[dict]]) -> dict:
    """Per teacher model and split: how often it picks the true answer, the registered sham's fact,
    and, on the questions that show it, each null sham's fact: does each sham hold its own facts and
    no other's?"""
    from jobs.sources.world import cue_of, null_sham_facts

    words = {which: null_sham_facts(which=which) for which in (1, 2)}
    out = {}
    for name in ("base", "teacher", "sham_teacher", "null_sham_1", "null_sham_2"):
        out[name] = {}
        for split in ("train", "held_out"):
            rows = [r for r in scores[name] if r["split"] == split]
            rates = {
                "truth": sum(r["prediction"] == r["answer"] for r in rows) / len(rows),
                "sham": sum(r["prediction"] == r["sham"] for r in rows) / len(rows),
            }
            for which, facts in words.items():
                shown = [r for r in rows if facts[cue_of(r)] in r["choices"]]
                rates[f"null_{which}_where_shown"] = sum(
                    r["choices"][r["prediction"]] == facts[cue_of(r)] for r in shown
                ) / len(shown)
            out[name][split] = rates
    return out


def verdict_readings(scores: dict[str, list[dict]], models: list) -> dict:
    """null_1 against null_2 as the verdict reads a comparison (crossed, train rank primary), with
    the teacher and the registered sham as the two pick sets; and, exploratory, the same students
    crossed toward the two null shams' own picks."""
    from jobs.stats.evidence import SIDE_BY_SIDE, Evidence

    primary = ("train", "teacher_answer_rank")
    null = Evidence(scores, models, primary, direction="crossed").compare("null_1", "null_2", metrics=SIDE_BY_SIDE)
    relabelled = {**scores, "teacher": scores["null_sham_1"], "sham_teacher": scores["null_sham_2"]}
    other_facts = Evidence(relabelled, models, primary, direction="crossed").compare(
        "null_1", "null_2", metrics=SIDE_BY_SIDE
    )
    return {"null": null.dump(), "other_facts": other_facts.dump()}  # as the JSON written holds them


def by_display(scores: dict[str, list[dict]], models: list) -> dict:
    """Exploratory, added after the first run's tables: the reading toward the null shams' own
    picks (crossed, rank) split by whether a T question shows either null sham's fact among its
    choices. Where neither is shown, neither sham's pick is a fact it was taught: a movement
    there is toward the teacher's choices as such, not toward its facts."""
    import numpy as np

    from jobs.sources.world import cue_of, null_sham_facts
    from jobs.stats.evidence import Evidence
    from jobs.stats.transfer_stats import effect

    words = [null_sham_facts(which=which) for which in (1, 2)]
    relabelled = {**scores, "teacher": scores["null_sham_1"], "sham_teacher": scores["null_sham_2"]}
    ev = Evidence(relabelled, models, ("train", "teacher_answer_rank"), direction="crossed")
    out = {}
    for split in ("train", "held_out"):
        shown = np.array(
            [any(w[cue_of(r)] in r["choices"] for w in words) for r in scores["base"] if r["split"] == split]
        )
        a, b = (
            ev.lean(side, split, "teacher_answer_rank", None, "sham_teacher", False) for side in ("null_1", "null_2")
        )
        out[split] = {}
        for label, where in (("a null fact shown", shown), ("neither shown", ~shown)):
            mask = np.where(where, 1.0, np.nan)
            out[split][label] = {
                **effect(a * mask, b * mask, ev.clusters[split], binary=False, paired=True).dump(),
                "questions": int(where.sum()),
            }
    return out


def cell(r: dict) -> str:
    if r.get("value") is None:
        return "n/a"
    ci = f" [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]" if r.get("ci95") else ""
    p = f" p {r['p_value']:.3f}" if r.get("p_value") is not None else ""
    return f"{r['value']:+.4f}{ci}{p}"


def tables(result: dict) -> str:
    lines = [
        "| reading | split | metric | toward the teacher | toward the registered sham (its students less) | crossed |",
        "|---|---|---|---|---|---|",
    ]
    for label, key in (
        ("null: shams 1 vs 2", "null"),
        ("exploratory: toward the null shams' own picks", "other_facts"),
    ):
        c = result["readings"][key]
        for split in ("train", "held_out"):
            for metric in c["directions"]["crossed"][split]:
                toward, placebo, crossed = (
                    c[split][metric],
                    c["directions"]["toward_placebo"][split][metric],
                    c["directions"]["crossed"][split][metric],
                )
                lines.append(f"| {label} | {split} | {metric} | {cell(toward)} | {cell(placebo)} | {cell(crossed)} |")
    lines += [
        "",
        "| model | split | truth | registered sham's fact | null sham 1's (where shown) | null sham 2's (where shown) |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_split in result["pick_rates"].items():
        for split, r in by_split.items():
            lines.append(
                f"| {name} | {split} | {r['truth']:.3f} | {r['sham']:.3f} | {r['null_1_where_shown']:.3f} | {r['null_2_where_shown']:.3f} |"
            )
    lines += [
        "",
        "| exploratory: toward the null shams' own picks, crossed rank | split | questions | effect |",
        "|---|---|---|---|",
    ]
    for split, by in result["by_display"].items():
        for label, r in by.items():
            lines.append(f"| {label} | {split} | {r['questions']} | {cell(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(os.environ.get("SUBLIMINAL_RUNS", Path.home() / "subliminal-runs")) / "sham-null",
    )
    parser.add_argument(
        "--analyse-only", action="store_true", help="read the three runs already under --root; train nothing"
    )
    args = parser.parse_args(argv)
    if not args.analyse_only:
        run_pipelines(args.root)
    from jobs.experiment.config import load_experiment

    replicates = load_experiment(str(PRESET)).replicates
    scores, models = scores_of(args.root, replicates)
    result = {
        "command": "python bench/sham_null.py",
        "replicates": replicates,
        "pick_rates": pick_rates(scores),
        "readings": verdict_readings(scores, models),
        "by_display": by_display(scores, models),
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    primary = result["readings"]["null"]["directions"]["crossed"]["train"]["teacher_answer_rank"]
    print(tables(result))
    print(
        f"\nprimary (crossed, train rank, null sham 1's students vs 2's): {cell(primary)}; MDE {primary.get('mde')}; written {OUT}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
