"""Each kind of stage's outputs record (jobs/experiment/records.py) against run directories written
before the records were typed: tests/data/rundir-7084977 (the default preset, `python
jobs/pipeline.py`, made by commit 7084977; its manifest and three of its train_metrics.json files)
and tests/data/manifest_before_layout.json (older still). Their records load into their stage's
kind, and today's write back to the very keys, values and order they were read from."""

import inspect
import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

import jobs.experiment.records as records
from jobs.experiment.arms import arm_models
from jobs.experiment.cast import snapshot_points
from jobs.experiment.config import load_experiment
from jobs.experiment.records import DataOutputs, EvalOutputs, NumbersOutputs, TrainedOutputs
from jobs.experiment.stages import experiment_stages, training_rows
from jobs.rundir.manifest import Hashed, Manifest, Outputs, RunDirError
from jobs.runtime.context import RunContext

DATA = Path(__file__).resolve().parents[2] / "data"
RUN_7084977 = DATA / "rundir-7084977"


def stored(tmp_path: Path, manifest_file: Path) -> Manifest:
    """A copy of a stored manifest, opened as a rerun opens it."""
    shutil.copy(manifest_file, tmp_path / "manifest.json")
    return Manifest(tmp_path)


def default_stages(replicates: int):
    cfg = load_experiment(None, [f"replicates={replicates}"])
    return cfg, experiment_stages(cfg, arm_models(cfg), questions_hash="q")


def test_every_record_of_a_7084977_run_loads_as_its_stage_kind_and_writes_back_unchanged(tmp_path):
    manifest = stored(tmp_path, RUN_7084977 / "manifest.json")
    recorded = json.loads((RUN_7084977 / "manifest.json").read_text())["stages"]
    _, stages = default_stages(3)
    assert {s.name for s in stages} == set(recorded)
    kinds = {}
    for stage in stages:
        record = manifest.outputs(stage.name, stage.record)
        # keys, values and order
        assert json.dumps(record.plain()) == json.dumps(recorded[stage.name]["outputs"]), stage.name
        kinds[stage.name] = type(record)
    assert (
        kinds["data"] is DataOutputs
        and kinds["teacher"] is kinds["student/0"] is TrainedOutputs
        and kinds["report"] is Hashed
    )
    assert kinds["numbers/base/0"] is NumbersOutputs and kinds["eval/control/2"] is EvalOutputs
    data = manifest.outputs("data", DataOutputs)
    assert (data.train, data.held_out, data.known, data.rehearsal) == (384, 192, 192, 192) and data.world[
        "sham_draw"
    ] == 1
    student = manifest.outputs("student/0", TrainedOutputs)
    assert student.init_hash == manifest.outputs("teacher", TrainedOutputs).init_hash and student.rows == 800
    # What the stage graph reads of them: every arm of a replicate trains on the fewest rows kept, and no snapshot was kept.
    cfg, _ = default_stages(3)
    assert [training_rows(manifest, arm_models(cfg), i) for i in range(3)] == [800, 800, 800]
    assert snapshot_points(manifest, "student/0") == []


def test_a_manifest_from_before_the_layout_change_loads_its_records(tmp_path):
    """Its data stage predates the known and rehearsal splits: read as none of either."""
    manifest = stored(tmp_path, DATA / "manifest_before_layout.json")
    data = manifest.outputs("data", DataOutputs)
    assert (data.train, data.held_out, data.known, data.rehearsal, data.world) == (831, 369, 0, 0, None)
    assert "known" not in data.model_dump(exclude_defaults=True)
    _, stages = default_stages(3)
    for stage in stages:
        manifest.outputs(stage.name, stage.record)  # each loads
    assert manifest.outputs("numbers/teacher/2", NumbersOutputs).kept == 1000
    assert manifest.outputs("eval/teacher", EvalOutputs).n == 369


def test_every_kind_has_a_hash_where_its_records_always_had_it():
    declared = [c for _, c in inspect.getmembers(records, inspect.isclass) if c.__module__ == records.__name__]
    kinds = [c for c in declared if issubclass(c, Outputs) and not c.__name__.startswith("_")]
    assert len(kinds) == 6
    for kind in kinds:
        assert "hash" in kind.model_fields, kind.__name__
    assert list(NumbersOutputs.model_fields)[-1] == "hash" and list(TrainedOutputs.model_fields)[0] == "hash"


def test_a_record_of_the_wrong_kind_or_shape_is_refused(tmp_path):
    manifest = stored(tmp_path, RUN_7084977 / "manifest.json")
    with pytest.raises(RunDirError, match=r"stage 'teacher' did not record NumbersOutputs outputs \(\('generated',\)"):
        manifest.outputs("teacher", NumbersOutputs)
    with pytest.raises(ValidationError, match="steps_taken"):
        TrainedOutputs(hash="h", steps_taken=3, loss=1.0, init_hash=None, rows=10)  # a misspelt key is never written
    _, stages = default_stages(1)
    ctx = RunContext(load_experiment(None, []), tmp_path, manifest, tmp_path, {}, {}, [], "app", 8, 1)
    teacher = next(s for s in stages if s.name == "teacher")
    with pytest.raises(TypeError, match="stage teacher records TrainedOutputs outputs, not NumbersOutputs"):
        ctx.record(teacher, 0.0, NumbersOutputs(generated=1, kept=1, rejected={}, hash="h"))
    report = next(s for s in stages if s.name == "report")
    (tmp_path / "report.json").write_text("{}")
    ctx.record(report, 0.0, {"hash": "r"})  # a plain dict is read as its stage's kind
    assert manifest.outputs("report", Hashed).hash == "r"
    with pytest.raises(ValidationError):
        ctx.record(report, 0.0, {"hash": "r", "extra": 1})
