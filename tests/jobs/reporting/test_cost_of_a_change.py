"""The cost of a new per-question statistic, measured (issue 67 item 7).

A toy statistic is added where a real one would be written: its entry in METRICS and its values in
`question_metrics` (jobs/stats/transfer_stats.py), the function changed for every module holding it,
as an edit of its body would. Nothing else is touched. Fed by hand-made score tables (as
tests/jobs/stats/test_directions.py), the comparison carries it; put in a kept report, it reaches
report.json, the schema's check, report.md and MLflow's parent metrics as far as each goes today.
Where it does not reach (a docs line, MLflow beyond the primary test), the test says so.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from jobs.experiment.arms import ArmModel
from jobs.experiment.rows_kinds import KINDS
from jobs.reporting.markdown import cells, markdown
from jobs.reporting.schema import Report
from jobs.stats import transfer_stats
from jobs.stats.evidence import Evidence
from jobs.tracking import report_metrics
from train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[3]
# a real report, as the pipeline writes it
REPORT = Report.load(sorted((ROOT / "results" / "tiny").glob("*/report.json"))[-1])
TOY = "toy_top_logprob"


@pytest.fixture
def toy_statistic(monkeypatch):
    """The edit a contributor makes in jobs/stats/transfer_stats.py: a METRICS line and its values."""
    monkeypatch.setitem(transfer_stats.METRICS, TOY, "the log-probability of the model's own pick minus its base's")
    original = transfer_stats.question_metrics

    def question_metrics(rows, teacher, base, temperatures=None):
        own = np.array([max(r["logprobs"]) - max(b["logprobs"]) for r, b in zip(rows, base)])
        return original(rows, teacher, base, temperatures) | {TOY: own}

    for module in list(sys.modules.values()):  # every holder of the function sees the edited one
        if vars(module).get("question_metrics") is original:  # vars: a lazy module's __getattr__ would import
            monkeypatch.setattr(module, "question_metrics", question_metrics)


def comparison(primary: str):
    """student (sharper by 0.5 nats on its pick, per replicate and question) against control."""
    qs = [
        {"question": f"{s}{c}", "cluster": c, "split": s, "answer": 0} for s in ("train", "held_out") for c in range(12)
    ]
    row = lambda q, lp: {**q, "logprobs": lp, "prediction": int(np.argmax(lp))}  # noqa: E731
    flat = [-1.2, -1.5, -1.5, -1.5]
    models = [
        ArmModel(
            arm,
            i,
            source,
            False,
            "sft",
            "teacher",
            TrainConfig(),
            True,
            kind=KINDS[source],
            against=against,
            reference=words,
            signal=None,
        )
        for arm, source, against, words in (
            ("student", "teacher", "control", "control arm"),
            ("control", "base", "base", "base model"),
        )
        for i in range(2)
    ]
    scores = {"base": [row(q, flat) for q in qs], "teacher": [row(q, [-0.1, -3.0, -3.0, -3.0]) for q in qs]}
    for m in models:  # per question and replicate a spread, so the difference has an interval
        bump = lambda q, m=m: (  # noqa: E731
            0.5 + 0.05 * ((7 * q["cluster"] + 3 * m.replicate) % 5)
            if m.arm == "student"
            else 0.02 * ((3 * q["cluster"] + m.replicate) % 4)
        )
        scores[m.name] = [row(q, [flat[0] + bump(q), *flat[1:]]) for q in qs]
    return Evidence(scores, models, ("held_out", primary)).compare("student", "control")


def with_transfer(result) -> Report:
    arm = REPORT.arms["student"].model_copy(update={"transfer": result})
    return REPORT.model_copy(update={"arms": {**REPORT.arms, "student": arm}})


def test_a_toy_statistic_in_its_module_reaches_report_json_the_schema_and_report_md(toy_statistic, tmp_path):
    result = comparison("teacher_answer_rank")
    toy = result.cell("held_out", TOY)
    assert toy.value is not None and toy.value > 0.4  # the student's sharper pick, against the control's
    report = with_transfer(result)
    written = json.loads(json.dumps(report.dump()))
    assert written["arms"]["student"]["transfer"]["held_out"][TOY]["value"] == pytest.approx(toy.value)  # report.json
    assert written["arms"]["student"]["transfer"]["held_out"]["mde"][TOY] == pytest.approx(toy.mde)
    # the schema takes it
    assert Report.parse(written).arms["student"].transfer.cell("held_out", TOY).value == pytest.approx(toy.value)
    assert toy.ci95 is not None and toy.ci95[0] > 0.4
    # report.md, its row in the arm's table
    assert f"| held_out | {TOY} | {cells(toy)} |" in markdown(report).splitlines()


def test_a_toy_statistic_reaches_mlflow_as_a_primary_test_and_only_inside_report_json_otherwise(toy_statistic):
    """The parent run's metrics carry each comparison's primary test (jobs/tracking.report_metrics):
    a toy chosen as the primary metric is there; a secondary one reaches MLflow only in the
    report.json artifact. Not one edit: a metric per secondary cell would be a tracking change."""
    primary = comparison(TOY)
    assert primary.primary.metric == TOY
    assert report_metrics(with_transfer(primary))["verdict.student.effect"] == pytest.approx(
        primary.cell("held_out", TOY).value
    )
    secondary = report_metrics(with_transfer(comparison("teacher_answer_rank")))
    assert not [key for key in secondary if TOY in key]


def undocumented(metrics, doc: str) -> list[str]:
    """Metrics without a row in docs/report.md's metric table (a row names it in backquotes)."""
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    return [m for m in metrics if not any(f"`{m}`" in line.split(" | ")[0] for line in rows)]


def test_every_statistic_has_its_docs_line_and_a_toy_without_one_is_named(toy_statistic):
    doc = (ROOT / "docs" / "report.md").read_text()
    assert undocumented([m for m in transfer_stats.METRICS if m != TOY], doc) == []
    assert undocumented(transfer_stats.METRICS, doc) == [TOY]  # the docs line is the one edit outside the module
