"""report.json's schema (jobs/reporting/schema.py): the reports the project keeps match it, a report
of another shape is refused before anything is written, and docs/report.md shows it as it is."""

import copy
import json
from pathlib import Path

import pytest

from jobs.phases.report import write_report
from jobs.reporting.schema import Report, ReportShapeError, check_report, with_schema

ROOT = Path(__file__).resolve().parents[3]
KEPT = sorted((ROOT / "results").glob("*/*/report.json"))


def test_docs_report_md_shows_the_schema_as_the_models_declare_it():
    doc = (ROOT / "docs" / "report.md").read_text()
    assert with_schema(doc) == doc, "regenerate it: python -m jobs.reporting.schema --write docs/report.md"


@pytest.mark.parametrize("path", KEPT, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_kept_report_loads_and_writes_back_as_it_was(path):
    check_report(json.loads(path.read_text()))
    # as write_json wrote it: every key, value and order
    assert json.dumps(Report.load(path).dump(), indent=2) + "\n" == path.read_text()


def a_report() -> dict:
    """A kept report of the registered preset: an overt control, a sham twin, directions."""
    return json.loads(next(p for p in KEPT if p.parts[-3] == "tiny-confirm").read_text())


@pytest.mark.parametrize(
    "change, named",
    [
        (
            lambda r: r["arms"]["student_logits"].__setitem__("verdicts", r["arms"]["student_logits"].pop("verdict")),
            "arms.student_logits.verdict: Field required",
        ),
        (
            lambda r: r["arms"]["student_logits"]["transfer"]["held_out"]["agreement"].__setitem__("pvalue", 0.1),
            "arms.student_logits.transfer.held_out.agreement.pvalue: Extra inputs",
        ),
        (
            lambda r: r["arms"]["student_logits"]["transfer"]["primary"].pop("split"),
            "arms.student_logits.transfer.primary.split: Field required",
        ),
        (lambda r: r["family"].__setitem__("size", "two"), "family.size: Input should be a valid integer"),
    ],
)
def test_a_report_of_another_shape_is_refused_naming_the_field_and_writes_nothing(tmp_path, change, named):
    report = a_report()
    assert "student_logits" in report["arms"]
    bad = copy.deepcopy(report)
    change(bad)
    with pytest.raises(ReportShapeError, match="report.json would not match its schema") as err:
        write_report(tmp_path, Report.parse(bad))
    assert named in str(err.value)
    assert not list(tmp_path.iterdir())
