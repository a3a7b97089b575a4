"""The verdict tables in BENCHMARKS.md are the ones rendered from the reports kept under results/
(bench/verdict_tables.py): a table cannot drift from the report behind it."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from verdict_tables import BLOCK, main, render, rerender  # noqa: E402


def test_the_marked_tables_in_benchmarks_are_the_rendered_ones():
    text = (ROOT / "BENCHMARKS.md").read_text()
    blocks = list(BLOCK.finditer(text))
    assert blocks, "BENCHMARKS.md marks no verdict table (<!-- verdicts: results/... -->)"
    for block in blocks:
        # a run of pairs, or one
        kept = (
            ["pooled.json", "pooled.md"]
            if (ROOT / block["run"] / "pooled.json").is_file()
            else ["report.json", "report.md"]
        )
        assert all((ROOT / block["run"] / name).is_file() for name in kept), block["run"]
        assert block["body"] == render(Path(block["run"])), (
            f"{block['run']}: run python bench/verdict_tables.py --write BENCHMARKS.md"
        )
    assert rerender(text) == text


def test_a_table_edited_by_hand_fails_the_check(tmp_path):
    text = (ROOT / "BENCHMARKS.md").read_text()
    block = next(BLOCK.finditer(text))
    edited = tmp_path / "BENCHMARKS.md"
    edited.write_text(text.replace(block["body"], block["body"].replace("|", "| ", 1)))
    assert main(["--check", str(edited)]) == 1
    assert main(["--write", str(edited)]) == 0 and main(["--check", str(edited)]) == 0 and edited.read_text() == text


def test_a_table_without_its_report_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no report kept for this table"):
        render(tmp_path / "results" / "tiny" / "missing")


# a run's, or each pair's of a run
KEPT_WITH_SCORES = sorted(p.parent.relative_to(ROOT) for p in (ROOT / "results").rglob("scores.tar.gz"))


@pytest.mark.parametrize("kept", KEPT_WITH_SCORES, ids=str)
def test_every_kept_run_with_scores_is_its_report_again(kept):
    """Every kept run that holds its per-question scores: its report built again from them
    (python -m jobs.rebuild) holds every kept figure equally."""
    import json

    from jobs.rebuild import differences, rebuild

    rebuilt = json.loads(json.dumps(rebuild(ROOT / kept).dump(), default=str))
    assert differences(json.loads((ROOT / kept / "report.json").read_text()), rebuilt) == []
