"""Pooling a design's pairs (jobs/reporting/pairs.py): each pair's report read back, every shared
reading pooled as jobs/stats/pooling.pool pools it, the family's primaries Holm-adjusted, and the
files written. The pairs are the registered tiny-confirm report with its readings shifted per pair:
real reports, known inputs."""

import copy
import json
from pathlib import Path

import pytest

from jobs.reporting.pairs import pairs_report, within_se, write_pairs_report
from jobs.stats.pooling import pool
from jobs.stats.results import Result

KEPT = Path(__file__).resolve().parents[3] / "results" / "tiny-confirm" / "2026-11-27-febdbed" / "report.json"
SHIFTS = {"3": -0.02, "4": 0.0, "5": 0.035}


def shifted(report: dict, shift: float, widen: float) -> dict:
    """The report with every reading of student_logits moved by `shift` and its interval widened by `widen`."""
    out = copy.deepcopy(report)
    transfer = out["arms"]["student_logits"]["transfer"]
    tables = [
        transfer["train"],
        transfer["held_out"],
        *(t for d in ("toward_placebo", "crossed") for t in transfer["directions"][d].values()),
    ]
    for cell in [transfer["primary"], *(c for t in tables for k, c in t.items() if k != "mde")]:
        if cell.get("value") is not None and cell.get("ci95"):
            lo, hi = cell["ci95"]
            mid = cell["value"]
            cell["value"], cell["ci95"] = (
                mid + shift,
                [mid + shift - (mid - lo) * widen, mid + shift + (hi - mid) * widen],
            )
    return out


@pytest.fixture
def run_dir(tmp_path) -> Path:
    kept = json.loads(KEPT.read_text())
    for i, (pair, shift) in enumerate(SHIFTS.items()):
        folder = tmp_path / "pairs" / pair
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps(shifted(kept, shift, 1 + 0.2 * i)))
    return tmp_path


def test_the_primary_is_pooled_as_pool_pools_it(run_dir):
    report, primaries = pairs_report(run_dir, [3, 4, 5])
    primary = report.comparisons["student_logits"].primary
    assert (primary.split, primary.metric, primary.direction) == ("train", "teacher_answer_rank", "crossed")
    values = [c.value for c in primary.pairs.values()]
    ses = [c.se for c in primary.pairs.values()]
    expected = pool(values, [s**2 for s in ses], names=list(primary.pairs), test="hk")
    assert primary.estimate == pytest.approx(expected.estimate) and primary.ci95 == pytest.approx(list(expected.ci))
    assert primary.tau == pytest.approx(expected.tau) and primary.df == 2
    assert values == pytest.approx([0.0505 + s for s in SHIFTS.values()], abs=1e-3)
    assert report.family == ["student_logits"] and primary.p_family == primary.p_value  # a family of one
    assert primaries["student_logits"].n_pairs == 3
    corrected = pool(values, [s**2 for s in ses], names=list(primary.pairs), test="hk_max1")
    assert primary.p_value_other == pytest.approx(corrected.p_value) and primary.regime is None  # df 46, SEs within 2x


def test_a_pair_outside_plain_hks_regime_is_named():
    from jobs.reporting.pairs import regime

    fine = {"1": Result(value=0.05, ci95=[0.02, 0.08], df=46.0), "2": Result(value=0.04, ci95=[0.0, 0.08], df=30.0)}
    assert regime(fine) is None
    few = {**fine, "3": Result(value=0.05, ci95=[0.0, 0.1], df=3.0)}
    assert "df under 20: 3 (3.0)" in regime(few)
    wide = {**fine, "3": Result(value=0.05, ci95=[-0.2, 0.3], df=46.0)}
    assert "over 2x apart" in regime(wide)


def test_every_shared_reading_is_pooled_and_se_is_read_from_the_interval(run_dir):
    report, _ = pairs_report(run_dir, [3, 4, 5])
    readings = report.comparisons["student_logits"].readings
    assert set(readings) == {"toward_teacher", "toward_placebo", "crossed"}
    assert readings["crossed"]["train"]["teacher_answer_rank"].estimate == pytest.approx(
        report.comparisons["student_logits"].primary.estimate
    )
    result = Result(value=0.05, ci95=[0.03, 0.07], df=46.0)
    from scipy import stats

    assert within_se(result) == pytest.approx(0.02 / stats.t.ppf(0.975, 46))
    assert within_se(Result(value=0.05, ci95=None)) is None


def test_files_are_written(run_dir):
    write_pairs_report(run_dir, [3, 4, 5])
    pooled = json.loads((run_dir / "pooled.json").read_text())
    assert pooled["pairs"] == [3, 4, 5] and "student_logits" in pooled["comparisons"]
    assert (
        "| student_logits | train teacher_answer_rank crossed |" in (run_dir / "pooled.md").read_text()
        and "hk_max1 p" in (run_dir / "pooled.md").read_text()
    )
    assert (run_dir / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_pair_report_is_named(run_dir):
    with pytest.raises(FileNotFoundError):
        pairs_report(run_dir, [3, 4, 9])


def test_a_pair_whose_sham_is_not_matched_stays_in_the_test_and_is_read_apart(run_dir):
    """Every pair stays in the pooled tests as registered; the matched pairs alone are pooled beside
    them, and the unmatched pair is named. With every sham matched, neither appears."""
    report, _ = pairs_report(run_dir, [3, 4, 5])
    assert report.unmatched_shams is None and report.matched_only is None
    path = run_dir / "pairs" / "5" / "report.json"
    unmatched = json.loads(path.read_text())
    unmatched["sham_fit"]["matched"] = False
    path.write_text(json.dumps(unmatched))
    again, _ = pairs_report(run_dir, [3, 4, 5])
    assert again.unmatched_shams == ["5"] and set(again.comparisons["student_logits"].primary.pairs) == {"3", "4", "5"}
    only = again.matched_only["student_logits"]
    cells = [again.comparisons["student_logits"].primary.pairs[p] for p in ("3", "4")]
    expected = pool([c.value for c in cells], [c.se**2 for c in cells], names=["3", "4"], test="hk")
    assert set(only.pairs) == {"3", "4"} and only.estimate == pytest.approx(expected.estimate) and only.df == 1
