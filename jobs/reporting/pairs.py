"""A design run over teacher–sham pairs: every comparison pooled over the pairs (docs/pooling.md).

Each pair's run is a run of its own (`<run dir>/pairs/<p>/report.json`, a `Report`), analysed as
one pair always was: its replicates and questions say how well that pair is measured. A verdict
must hold for other teachers too, so this module reads the pairs' reports and pools each reading
they share with a random-effects model (jobs/stats/pooling.py: the pair random, its replicates and
questions within): the primary test of every comparison (arm or contrast), Holm-adjusted over the
preset's family, and every split and metric toward the teacher's picks, toward the placebo's and
crossed. A pair's within-pair variance is its result's standard error squared, read back from its
95% interval at its own df (`within_se`).

What it writes beside the pairs' folders: `pooled.json` (a `PairsReport`), `pooled.md`, and
`forest.png` (one panel per comparison of the family: its primary, pair by pair and pooled).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from scipy import stats

from common.atomic import write_text
from jobs.reporting.schema import Report
from jobs.stats.pooling import Pooled, mde, pool
from jobs.stats.probes import READINGS, decide
from jobs.stats.results import Probes, Record, Result
from jobs.stats.transfer_stats import holm

DIRECTIONS = ("toward_teacher", "toward_placebo", "crossed")
OTHER_TEST = {"hk": "hk_max1", "hk_max1": "hk", "t": "hk"}  # the sensitivity reading beside the primary's test
MIN_DF, MAX_SE_RATIO = 20, 2.0  # plain HK's size held within 4.7-5.7% inside these (docs/pooling.md)


class PairCell(Record):
    """One pair's reading: its estimate, 95% interval and the standard error taken from it."""

    value: float
    ci95: list[float]
    se: float


class PooledCell(Record):
    """One reading pooled over the pairs: estimate, its CI and p (`test` on a t with pairs - 1 df),
    tau (the SD of the pairs' true effects), I^2, Cochran's Q and its p, and each pair's reading;
    or, where some pair has no test of it, `note` saying so and no figures."""

    estimate: float | None = None
    se: float | None = None
    ci95: list[float] | None = None
    p_value: float | None = None
    df: int | None = None
    tau: float | None = None
    i2: float | None = None
    q: float | None = None
    q_p_value: float | None = None
    test: str | None = None
    pairs: dict[str, PairCell] = {}
    note: str | None = None


class PooledPrimary(PooledCell):
    """A comparison's primary test pooled, with its Holm p over the family and whether it is
    detected; the other HK test's p beside it (`p_value_other`, docs/pooling.md), and `regime`: a
    note where a pair's df or SE leaves the conditions under which plain HK holds its size."""

    split: str
    metric: str
    direction: str
    p_value_other: float | None = None
    regime: str | None = None
    p_family: float | None = None
    detected: bool = False


class PooledComparison(Record):
    """A comparison (arm or contrast) pooled: its primary, and `<direction>.<split>.<metric>`."""

    primary: PooledPrimary
    readings: dict[str, dict[str, dict[str, PooledCell]]]


class PooledProbes(Record):
    """An arm's probe readings (jobs/stats/probes.py) pooled over the pairs whose teachers pass the
    swap gates (`pairs`; `left_out` the others), the statement reading over those of them whose
    teachers also hold their facts as statements (`statement_pairs`), and the same rule read on the
    pooled tests; no figures where fewer than two pairs pass."""

    pairs: list[str]
    left_out: list[str]
    statement_pairs: list[str] = []
    train: dict[str, PooledCell] = {}
    statement: PooledCell | None = None
    knowledge: bool = False
    cue_bound: bool = False
    answer_preference: bool = False
    reading: str


class PairsReport(Record):
    """`pooled.json`: the pairs, their reports, each comparison pooled, the family, the MDE of the
    pooled primary at an assumed tau, the test used, and each arm's probe readings pooled."""

    pairs: list[int]
    reports: dict[str, str]  # pair -> its report.json, relative to the run directory
    test: str
    tau2_method: str
    comparisons: dict[str, PooledComparison]
    family: list[str]
    mde: dict[str, float | None]  # at assumed_tau and at tau 0
    assumed_tau: float
    probes: dict[str, PooledProbes] | None = None
    # Pairs whose sham is not matched (report.sham_fit), kept in every pooled test as registered;
    # beside them, exploratory, the family's primaries pooled over the matched pairs alone.
    unmatched_shams: list[str] | None = None
    matched_only: dict[str, PooledCell] | None = None


def typical_se(ses: list[float]) -> float | None:
    """The root mean square of the pairs' standard errors (None for none): the within-pair SE an MDE
    at P pairs is read at (jobs/stats/pooling.mde)."""
    return math.sqrt(sum(s**2 for s in ses) / len(ses)) if ses else None


def within_se(result: Result) -> float | None:
    """A result's standard error, from its 95% interval: half its width over t(0.975, df) (the
    normal where it has no df). None where it has no two-sided finite interval."""
    ci = result.ci95
    if result.value is None or not ci or ci[0] is None or ci[1] is None or not all(map(math.isfinite, ci)):
        return None
    quantile = stats.t.ppf(0.975, result.df) if result.df else stats.norm.ppf(0.975)
    return (ci[1] - ci[0]) / (2 * quantile)


def pool_readings(results: dict[str, Result], test: str, tau2_method: str = "reml") -> tuple[PooledCell, Pooled | None]:
    """One reading over the pairs (`{pair: Result}`): pooled, or a note where a pair has no test."""
    cells = {}
    for pair, result in results.items():
        se = within_se(result)
        if se is None or se <= 0:
            return PooledCell(
                note=f"pair {pair} has no test of this reading ({result.note or 'no interval'}): not pooled"
            ), None
        cells[pair] = PairCell(value=result.value, ci95=list(result.ci95), se=se)
    values, variances = [c.value for c in cells.values()], [c.se**2 for c in cells.values()]
    # a pair's row in the forest: its own t interval
    own_df = [result.df if result.df else 1e9 for result in results.values()]
    pooled = pool(values, variances, names=list(cells), test=test, tau2_method=tau2_method, pair_df=own_df)
    cell = PooledCell(
        estimate=pooled.estimate,
        se=pooled.se,
        ci95=None if pooled.ci is None else list(pooled.ci),
        p_value=pooled.p_value,
        df=pooled.df,
        tau=pooled.tau,
        i2=pooled.i2,
        q=pooled.q,
        q_p_value=pooled.q_p_value,
        test=test,
        pairs=cells,
    )
    return cell, pooled


def regime(results: dict[str, Result]) -> str | None:
    """None where every pair's df is at least MIN_DF and no SE is over MAX_SE_RATIO times another's
    (plain HK's size holds there, docs/pooling.md); else what is outside, so the corrected p is read."""
    ses = [s for r in results.values() if (s := within_se(r))]
    low_df = {pair: r.df for pair, r in results.items() if (r.df or 0) < MIN_DF}
    out = []
    if low_df:
        out.append(
            "pairs with df under "
            + str(MIN_DF)
            + ": "
            + ", ".join(f"{p} ({df:.1f})" if df else f"{p} (none)" for p, df in low_df.items())
        )
    if ses and max(ses) > MAX_SE_RATIO * min(ses):
        out.append(f"within-pair SEs {min(ses):.4f} to {max(ses):.4f}, over {MAX_SE_RATIO:g}x apart")
    return "; ".join(out) + ": plain HK may be liberal here, read the corrected p" if out else None


def _readings(comparison) -> dict[str, dict[str, dict[str, Result]]]:
    """`<direction>.<split>.<metric>` of one pair's comparison (jobs/stats/results.Comparison)."""
    out = {"toward_teacher": {split: comparison.split(split).metrics for split in ("train", "held_out")}}
    if comparison.directions is not None:
        out |= {
            d: table for d in ("toward_placebo", "crossed") if (table := getattr(comparison.directions, d)) is not None
        }
    return out


def _pool_comparison(sides: dict, test: str) -> tuple[PooledComparison, Pooled | None]:
    """One comparison (`{pair: Comparison}`) pooled: its primary (with the other test's p and the
    regime note) and every reading all pairs share; and the primary's Pooled, for the forest plot."""
    firsts = {pair: c.primary for pair, c in sides.items()}
    tables = {pair: _readings(c) for pair, c in sides.items()}
    primary, pooled = pool_readings(firsts, test)
    readings = {}
    for direction, table in next(iter(tables.values())).items():
        for split, metrics in table.items():
            for metric in metrics:
                one = {pair: t.get(direction, {}).get(split, {}).get(metric) for pair, t in tables.items()}
                if all(r is not None for r in one.values()):
                    readings.setdefault(direction, {}).setdefault(split, {})[metric] = pool_readings(one, test)[0]
    spec = next(iter(firsts.values()))
    head = PooledPrimary(split=spec.split, metric=spec.metric, direction=spec.direction, **primary.given())
    if pooled is not None:
        conditions = regime(firsts) if test != "t" else None  # the t on the estimates reads no within-pair SE
        head = head.with_(p_value_other=pool_readings(firsts, OTHER_TEST[test])[0].p_value, regime=conditions)
    return PooledComparison(primary=head, readings=readings), pooled


def pooled_probes(probes: dict[str, Probes | None], test: str) -> dict[str, PooledProbes] | None:
    """Every arm's probe readings (`{pair: its report's probes}`) pooled over the pairs whose gates
    pass (PooledProbes); None where some pair scored no probes."""
    if any(p is None for p in probes.values()):
        return None
    passing = [pair for pair, p in probes.items() if p.gates_passed]
    known = [pair for pair in passing if probes[pair].statements_known]
    left_out = [pair for pair in probes if pair not in passing]

    def toward(c: PooledCell | None) -> bool:
        """A pooled reading detected above zero: its estimate positive, p below 0.05 (no reading, or no test: False)."""
        return (
            c is not None and c.estimate is not None and c.estimate > 0 and c.p_value is not None and c.p_value < 0.05
        )

    out = {}
    for arm in next(iter(probes.values())).arms:
        if len(passing) < 2:
            out[arm] = PooledProbes(pairs=passing, left_out=left_out, **decide(False, False, False, False, False))
            continue
        sides = {pair: probes[pair].arms[arm] for pair in passing}
        train = {
            reading: pool_readings({p: a.train[reading] for p, a in sides.items()}, test)[0] for reading in READINGS
        }
        statement = pool_readings({p: sides[p].statement for p in known}, test)[0] if len(known) >= 2 else None
        tests = (toward(train["cue_bound"]), toward(train["swap"]), toward(statement))
        out[arm] = PooledProbes(
            pairs=passing,
            left_out=left_out,
            statement_pairs=known,
            train=train,
            statement=statement,
            **decide(*tests, True, len(known) >= 2),
        )
    return out


def pairs_report(
    run_dir: Path, pairs: list[int], test: str = "hk", assumed_tau: float = 0.015
) -> tuple[PairsReport, dict[str, Pooled]]:
    """The pairs' reports pooled (module docstring), and each family comparison's pooled primary
    (for the forest plot). Every pair must have finished its report."""
    reports = {str(p): Report.load(run_dir / "pairs" / str(p) / "report.json") for p in pairs}
    each = {pair: r.comparisons(with_base=True) for pair, r in reports.items()}
    first = next(iter(reports.values()))
    names = [name for name in each[str(pairs[0])] if all(name in c for c in each.values())]
    comparisons, primaries = {}, {}
    for name in names:
        comparisons[name], primaries[name] = _pool_comparison({pair: c[name][1] for pair, c in each.items()}, test)
    family = [n for n in first.family.comparisons if n in comparisons]
    adjusted = holm({n: comparisons[n].primary.p_value for n in family})
    for n in family:
        p = adjusted[n]
        comparisons[n] = comparisons[n].with_(
            primary=comparisons[n].primary.with_(p_family=p, detected=p is not None and p < 0.05)
        )
    typical = typical_se([c.se for n in family if (pooled := primaries[n]) for c in pooled.pairs])
    at = (
        {
            f"assumed_tau {assumed_tau:g}": mde(len(pairs), typical, assumed_tau=assumed_tau),
            "tau 0": mde(len(pairs), typical, assumed_tau=0.0),
        }
        if typical
        else {}
    )
    report = PairsReport(
        pairs=list(pairs),
        reports={p: f"pairs/{p}/report.json" for p in reports},
        test=test,
        tau2_method="reml",
        comparisons=comparisons,
        family=family,
        mde=at,
        assumed_tau=assumed_tau,
    )
    if (probes := pooled_probes({pair: r.probes for pair, r in reports.items()}, test)) is not None:
        report = report.with_(probes=probes)
    unmatched = [pair for pair, r in reports.items() if r.sham_fit is not None and not r.sham_fit.matched]
    # every pair stays in the tests (dropping pairs after their data would choose the sample); a sensitivity reading beside them
    if unmatched:
        kept = [pair for pair in reports if pair not in unmatched]
        only = (
            {n: pool_readings({p: each[p][n][1].primary for p in kept}, test)[0] for n in family}
            if len(kept) >= 2
            else {}
        )
        report = report.with_(unmatched_shams=unmatched, matched_only=only)
    return report, {n: primaries[n] for n in family if primaries[n] is not None}


def markdown(report: PairsReport) -> str:
    """pooled.md: the family's pooled primaries, then each pair's primary reading."""
    lines = [f"# Pooled over {len(report.pairs)} teacher–sham pairs ({', '.join(map(str, report.pairs))})", ""]
    lines += [
        f"Random effects (REML tau^2), {report.test} on a t with {len(report.pairs) - 1} df; Holm over the family. docs/pooling.md.",
        "",
    ]
    other = OTHER_TEST[report.test]
    lines += [
        f"| comparison | primary | pooled | 95% CI | p | Holm p | {other} p | tau | I^2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in report.family:
        p = report.comparisons[name].primary
        if p.estimate is None:
            lines.append(f"| {name} | {p.split} {p.metric} {p.direction} | {p.note} | | | | | | |")
            continue
        ci = "-" if p.ci95 is None else f"{p.ci95[0]:+.4f} to {p.ci95[1]:+.4f}"
        holm_p, other_p = ("-" if v is None else f"{v:.3g}" for v in (p.p_family, p.p_value_other))
        cells = [
            name,
            f"{p.split} {p.metric} {p.direction}",
            f"{p.estimate:+.4f}",
            ci,
            f"{p.p_value:.3g}",
            holm_p,
            other_p,
            f"{p.tau:.4f}",
            f"{100 * p.i2:.0f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if p.regime:
            lines.append(f"|  | {p.regime} | | | | | | | |")
    lines += [
        "",
        "MDE of a pooled primary (80% power, 5% two-sided): "
        + "; ".join(f"{k} {v:.4f}" for k, v in report.mde.items() if v is not None),
        "",
    ]
    if report.unmatched_shams:
        lines += [
            f"Shams not matched in pairs {', '.join(report.unmatched_shams)}: kept in every test above, as registered. Exploratory, the matched pairs alone:"
        ]
        lines += [f"- {name}: {pooled_cell(c)}" for name, c in (report.matched_only or {}).items()] + [""]
    if report.probes:
        lines += ["## Probes, pooled over the pairs whose gates pass (train; docs/report.md, Probes)", ""]
        lines += [
            "| arm | pairs | original | swap | cue-bound | statement | reading |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm, pr in report.probes.items():
            cells = [pooled_cell(pr.train.get(r)) for r in READINGS] + [pooled_cell(pr.statement)]
            used = ", ".join(pr.pairs) + (f" (left out: {', '.join(pr.left_out)})" if pr.left_out else "")
            lines.append(f"| {arm} | {used} | " + " | ".join(cells) + f" | {pr.reading} |")
        lines.append("")
    for name in report.family:
        p = report.comparisons[name].primary
        lines += [f"## {name}, pair by pair", "", "| pair | estimate | 95% CI | SE |", "|---|---|---|---|"]
        lines += [
            f"| {pair} | {c.value:+.4f} | {c.ci95[0]:+.4f} to {c.ci95[1]:+.4f} | {c.se:.4f} |"
            for pair, c in p.pairs.items()
        ]
        lines.append("")
    return "\n".join(lines)


def pooled_cell(c: PooledCell | None) -> str:
    if c is None or c.estimate is None:
        return "-"
    return f"{c.estimate:+.4f} (p {c.p_value:.2g})"


def write_pairs_report(run_dir: Path, pairs: list[int], test: str = "hk", assumed_tau: float = 0.015) -> PairsReport:
    """pooled.json, pooled.md and forest.png (the family's pooled primaries) in the run directory."""
    from jobs.reporting.forest import plot_forest

    report, primaries = pairs_report(run_dir, pairs, test, assumed_tau)
    write_text(run_dir / "pooled.json", json.dumps(report.dump(), indent=1))
    write_text(run_dir / "pooled.md", markdown(report))
    for i, (name, pooled) in enumerate(primaries.items()):
        p = report.comparisons[name].primary
        plot_forest(
            pooled,
            run_dir / ("forest.png" if i == 0 else f"forest-{name}.png"),
            label=f"{p.split} {p.metric} ({p.direction})",
            title=name,
        )
    return report
