"""The verdict tables of BENCHMARKS.md, rendered from the reports kept under results/.

    python bench/verdict_tables.py results/tiny/2026-11-27-abc1234      # print one run's tables
    python bench/verdict_tables.py --check BENCHMARKS.md                 # exit 1 if a marked table differs
    python bench/verdict_tables.py --write BENCHMARKS.md                 # re-render every marked table
    python bench/verdict_tables.py --keep ~/subliminal-runs/tiny          # keep a run's report under results/

Every preset run a table reports keeps its `report.json` and `report.md` under
`results/<preset>/<date>-<commit>/` (committed), so anyone can re-derive a table from the report
behind it. In BENCHMARKS.md a table rendered here sits between two markers naming its run:

    <!-- verdicts: results/<preset>/<date>-<commit> -->
    ...the rendered tables...
    <!-- /verdicts -->

For one run: the primary verdicts (family, Holm, MDE, the fraction of overt transfer with its
Fieller interval); each comparison in every direction on the primary metric and split (toward the
teacher's picks, toward the placebo's, crossed) and its weight-space reading; and every model's
accuracy on the teacher's facts and on the sham's. tests/test_verdict_tables.py checks that the
marked tables in BENCHMARKS.md are these.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # run as `python bench/x.py`: bench/ stays first

from jobs.reporting.schema import Report  # noqa: E402
from jobs.stats.results import Estimate, Result  # noqa: E402

BLOCK = re.compile(r"<!-- verdicts: (?P<run>\S+) -->\n(?P<body>.*?)<!-- /verdicts -->", re.S)


def _ci(ci, percent: bool = False) -> str:
    if ci is None:
        return "-"
    cell = [("unbounded" if c is None else (f"{c:.0%}" if percent else f"{c:+.4f}")) for c in ci]
    return f"{cell[0]} to {cell[1]}"


def _p(p) -> str:
    return "-" if p is None else f"{p:.2g}"


def _value(r: Result | Estimate | None) -> str:
    return "-" if r is None or r.value is None else f"{r.value:+.4f}"


def family_table(report: Report) -> list[str]:
    """The primary verdicts: test, difference, CI, p, Holm p over the family, MDE, fraction of overt."""
    lines = [
        "| comparison | primary test | difference | 95% CI | p | Holm p (family) | MDE | fraction of overt (95% CI) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (against, result, arm) in report.comparisons().items():
        r = result.primary
        test = f"{r.metric} on {r.split}" + (", crossed" if r.direction == "crossed" else "")
        holm = "exploratory" if r.exploratory else _p(r.p_family)
        fraction = arm.fraction_of_overt if arm is not None else None
        share = (
            "-" if fraction is None or fraction.value is None else f"{fraction.value:.0%} ({_ci(fraction.ci95, True)})"
        )
        mde = "-" if r.mde is None else f"{r.mde:.4f}"
        lines.append(
            f"| {name} vs {against} | {test} | {_value(r)} | {_ci(r.ci95)} | {_p(r.p_value)} | {holm} | {mde} | {share} |"
        )
    return lines


def directions_table(report: Report) -> list[str]:
    """Each comparison on its primary metric and split, in every direction, and in weight space."""
    lines = [
        "| comparison | toward the teacher's picks | toward the placebo's picks | crossed | crossed update share |",
        "|---|---|---|---|---|",
    ]
    for name, (against, result, arm) in report.comparisons().items():
        directions, r = result.directions, result.primary
        if directions is None or directions.crossed is None:
            continue
        cells = [
            result.cell(r.split, r.metric),
            directions.toward_placebo[r.split][r.metric],
            directions.crossed[r.split][r.metric],
        ]
        weights = arm.weight_space.crossed if arm is not None and arm.weight_space is not None else None
        text = [f"{_value(c)} ({_ci(c.ci95)}, p {_p(c.p_value)})" for c in cells]
        lines.append(
            f"| {name} vs {against} | "
            + " | ".join(text)
            + f" | {_value(weights)} ({_ci(weights.ci95 if weights else None)}) |"
        )
    return lines if len(lines) > 2 else []


def facts_table(report: Report) -> list[str]:
    """Accuracy on the true answers and on the sham's facts, per split (report.sham_fit)."""
    fit = report.sham_fit
    if fit is None:
        return []
    lines = ["| model | true, train | true, held out | sham's, train | sham's, held out |", "|---|---|---|---|---|"]
    for name, a in fit.accuracy.items():
        cells = [a.true.train, a.true.held_out, a.sham.train, a.sham.held_out]
        lines.append(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return lines + [
        "",
        f"Sham fit: {'matched' if fit.matched else 'NOT matched'} (gaps "
        + ", ".join(f"{s} {g:+.3f}" for s, g in fit.gaps.items())
        + ").",
    ]


def pooled_tables(run: Path) -> list[str]:
    """A run of pairs (pooled.json, jobs/reporting/pairs.py): the family's pooled primaries with each
    one's MDE (its pairs' typical SE at tau 0 and at the assumed tau), then each pair's estimate,
    then each arm's probe readings pooled."""
    from jobs.reporting.pairs import PairsReport, pooled_cell, typical_se
    from jobs.stats.pooling import mde

    pooled = PairsReport.model_validate(json.loads((ROOT / run / "pooled.json").read_text()))
    lines = [
        f"| comparison | primary test, pooled ({pooled.test}, {len(pooled.pairs) - 1} df) | pooled | 95% CI | p | Holm p (family) | tau | I^2 | MDE (tau 0 / {pooled.assumed_tau:g}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in pooled.family:
        p = pooled.comparisons[name].primary
        typical = typical_se([c.se for c in p.pairs.values()])
        power = " / ".join(f"{mde(len(p.pairs), typical, assumed_tau=tau):.4f}" for tau in (0.0, pooled.assumed_tau))
        test = f"{p.metric} on {p.split}" + (", crossed" if p.direction == "crossed" else "")
        cells = [f"{p.estimate:+.4f}", _ci(p.ci95), _p(p.p_value), _p(p.p_family), f"{p.tau:.4f}", f"{p.i2:.0%}", power]
        lines.append(f"| {name} | {test} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| comparison | " + " | ".join(f"pair {q}" for q in pooled.pairs) + " |",
        "|---|" + "---|" * len(pooled.pairs),
    ]
    for name in pooled.family:
        cells = pooled.comparisons[name].primary.pairs
        lines.append(
            f"| {name} | "
            + " | ".join(f"{cells[str(q)].value:+.4f} ({_ci(cells[str(q)].ci95)})" for q in pooled.pairs)
            + " |"
        )
    if pooled.unmatched_shams:
        only = ", ".join(f"{n} {pooled_cell(c)}" for n, c in (pooled.matched_only or {}).items())
        lines += [
            "",
            f"Shams not matched in pairs {', '.join(pooled.unmatched_shams)}, kept in every test as registered; the matched pairs alone (exploratory): {only}.",
        ]
    if pooled.probes:
        lines += [
            "",
            "| arm, probes pooled (train, crossed) | pairs | cue-bound | swap | statement | reading |",
            "|---|---|---|---|---|---|",
        ]
        for arm, pr in pooled.probes.items():
            cells = [
                pooled_cell(pr.train.get("cue_bound")),
                pooled_cell(pr.train.get("swap")),
                pooled_cell(pr.statement),
            ]
            lines.append(f"| {arm} | {', '.join(pr.pairs)} | " + " | ".join(cells) + f" | {pr.reading} |")
    return lines


def render(run: Path) -> str:
    """One run's tables, as BENCHMARKS.md holds them between its markers (a run of pairs: its pooled tables)."""
    if (ROOT / run / "pooled.json").is_file():
        first = sorted((ROOT / run / "pairs").iterdir(), key=lambda p: int(p.name))[0]
        status = Report.load(first / "report.json").provenance.registration.status
        return (
            "\n".join(
                [
                    f"Rendered from `{run}/pooled.json` by `python bench/verdict_tables.py` ({status}).",
                    "",
                    *pooled_tables(run),
                ]
            )
            + "\n"
        )
    report_file = ROOT / run / "report.json"  # an absolute `run` stands alone
    if not report_file.is_file():
        raise FileNotFoundError(
            f"{report_file}: no report kept for this table (results/<preset>/<date>-<commit>/report.json)"
        )
    report = Report.load(report_file)
    lines = [
        f"Rendered from `{run}/report.json` by `python bench/verdict_tables.py` ({report.provenance.registration.status}).",
        "",
        *family_table(report),
    ]
    if directions := directions_table(report):
        lines += ["", *directions]
    if facts := facts_table(report):
        lines += ["", *facts]
    return "\n".join(lines) + "\n"


def keep(run_dir: Path) -> Path:
    """Copy a finished run's report.json and report.md to results/<preset>/<date>-<commit>/ (the
    commit the run started from, 7 digits), with its per-question scores and manifest packed in
    scores.tar.gz (`python -m jobs.rebuild <folder>` reports them again); returns that folder. A run
    of pairs keeps pooled.json and pooled.md there and each pair's run under pairs/<p>/ alike."""
    import shutil
    from datetime import date

    from jobs.rebuild import pack_scores

    pairs = (
        sorted((run_dir / "pairs").iterdir(), key=lambda p: int(p.name)) if (run_dir / "pooled.json").is_file() else []
    )
    provenance = Report.load((pairs[0] if pairs else run_dir) / "report.json").provenance
    commit = provenance.registration.commit or provenance.git_commit
    folder = ROOT / "results" / provenance.preset / f"{date.today().isoformat()}-{str(commit)[:7]}"
    for source, target in [(run_dir, folder)] if not pairs else [(p, folder / "pairs" / p.name) for p in pairs]:
        target.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "report.md"):
            shutil.copyfile(source / name, target / name)
        pack_scores(source, target)
    for name in ("pooled.json", "pooled.md") if pairs else ():
        shutil.copyfile(run_dir / name, folder / name)
    return folder


def rerender(text: str) -> str:
    """`text` with every marked block's body rendered anew from the run it names."""
    return BLOCK.sub(lambda m: f"<!-- verdicts: {m['run']} -->\n{render(Path(m['run']))}<!-- /verdicts -->", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="a kept run: results/<preset>/<date>-<commit>")
    parser.add_argument("--check", type=Path, help="a Markdown file whose marked tables must equal the rendered ones")
    parser.add_argument("--write", type=Path, help="a Markdown file whose marked tables are rendered anew")
    parser.add_argument("--keep", type=Path, help="a finished run directory whose report to keep under results/")
    args = parser.parse_args(argv)
    if args.keep:
        print(keep(args.keep).relative_to(ROOT))
    if args.run:
        print(render(args.run), end="")
    for path, write in ((args.check, False), (args.write, True)):
        if path is None:
            continue
        text = path.read_text()
        fresh = rerender(text)
        if write:
            path.write_text(fresh)
        elif fresh != text:
            print(
                f"{path}: a marked verdict table differs from its report; run python bench/verdict_tables.py --write {path}",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
