"""`TrainResult` and `Marks` (train/results.py) against train_metrics.json files written before they
existed: those of tests/data/rundir-7084977 (the default preset's run by commit 7084977: its
teacher, a student and a control). Each loads, gives its spans, and writes back byte for byte."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from train.results import METRICS_FILE, TRAINING_SPANS, Marks, StepReport, TrainFacts, TrainResult

RUN = Path(__file__).resolve().parents[1] / "data" / "rundir-7084977"
FOLDERS = ["teacher/adapter", "arms/student/0/adapter", "arms/control/0/adapter"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_7084977_result_loads_and_writes_back_byte_for_byte(folder, tmp_path):
    result = TrainResult.read(RUN / folder)
    assert result.done and result.step == result.total_steps == len(result.loss_history) == len(result.step_history)
    assert (
        [step for step, _ in result.loss_history]
        == [step for step, *_ in result.step_history]
        == list(range(1, result.step + 1))
    )
    assert (
        result.device == "cpu"
        and result.gpu_mem_gib is None
        and result.tokens_masked is None
        and result.checkpoint is None
    )
    result.write(tmp_path)
    assert (tmp_path / METRICS_FILE).read_bytes() == (RUN / folder / METRICS_FILE).read_bytes()
    # The worker's marks, in the order it reached them; the spans a worker's marks alone give.
    assert list(result.marks.stamps()) == [
        "process_started",
        "loop_started",
        "base_loaded",
        "job_started",
        "first_batch",
        "last_step",
        "saving",
    ]
    assert [kind for kind, _, _ in result.marks.spans()] == ["model load", "data wait", "compute", "save"]


def test_the_manifest_records_what_the_results_say():
    manifest = json.loads((RUN / "manifest.json").read_text())["stages"]
    for folder in FOLDERS:
        result, name = TrainResult.read(RUN / folder), folder.removeprefix("arms/").removesuffix("/adapter")
        out = manifest[name]["outputs"]
        assert (out["steps"], out["loss"], out["init_hash"], out["rows"], out["snapshot_steps"]) == (
            result.step,
            result.loss,
            result.init_hash,
            result.rows,
            result.snapshot_steps,
        )


def test_an_older_result_loads_with_what_it_lacks_at_its_defaults_and_drops_what_nothing_reads():
    """A file written before step_history, marks and device were kept (and with a key since dropped)."""
    data = json.loads((RUN / "teacher/adapter" / METRICS_FILE).read_text())
    older = {k: v for k, v in data.items() if k not in ("step_history", "marks", "device", "snapshot_steps")} | {
        "gone_key": 1
    }
    result = TrainResult.from_metrics(older)
    assert (
        result.step_history == [] and result.marks == Marks() and result.device is None and result.marks.spans() == []
    )
    assert result.loss_history == TrainResult.from_metrics(data).loss_history


def test_the_spans_name_marks_only_and_a_mark_that_is_not_one_is_refused():
    assert {m for _, a, b in TRAINING_SPANS for m in (a, b)} <= set(Marks.model_fields)
    marks = Marks(run_started=1.0, fit_started=2.0).at(loop_started=4.0, fit_finished=9.0)
    assert marks.spans() == [("prepare", 1.0, 2.0), ("start-up", 2.0, 4.0)]  # teardown lacks workers_done
    with pytest.raises(ValidationError, match="fit_sarted"):
        marks.at(fit_sarted=3.0)


def test_a_result_takes_its_last_report_and_its_facts_under_the_files_names():
    """The worker's pieces (train/loop.py) name the same keys: a report key the result lacks is refused."""
    data = TrainResult.read(RUN / "teacher/adapter").metrics()
    report = StepReport(**{k: data[k] for k in StepReport.model_fields if k in data})
    facts = TrainFacts(**{k: data[k] for k in TrainFacts.model_fields if k in data})
    rest = {k: data[k] for k in ("loss_history", "step_history", "snapshot_steps", "run_id")}
    assert TrainResult.of(report, facts, marks=Marks(**data["marks"]), **rest).metrics() == data
    assert list(report.metrics()) == list(StepReport.model_fields)[:13]  # off a GPU: no gpu_mem_gib, no mfu
    with pytest.raises(ValidationError):
        TrainResult.of(report, facts, marks=Marks(), loss_histroy=[], **rest)
