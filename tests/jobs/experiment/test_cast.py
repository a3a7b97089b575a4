"""The run's cast (jobs/experiment/cast.py): which models a run has, as the report reads them once."""

import shutil
from pathlib import Path

from jobs.experiment.arms import arm_models
from jobs.experiment.cast import cast_of, earlier_snapshots, number_sets
from jobs.experiment.config import load_experiment
from jobs.experiment.records import TrainedOutputs
from jobs.rundir.manifest import Manifest

RUN_7084977 = Path(__file__).resolve().parents[2] / "data" / "rundir-7084977"


def trained(manifest: Manifest, name: str, init: str, snapshots: list[int] = (), steps: int = 30) -> None:
    record = {"hash": "h", "steps": steps, "loss": 0.5, "init_hash": init, "rows": 10, "snapshot_steps": snapshots}
    manifest.record(name, {}, 1.0, record)


def test_the_cast_of_a_stored_run_is_its_models_as_its_manifest_recorded_them(tmp_path):
    shutil.copy(RUN_7084977 / "manifest.json", tmp_path / "manifest.json")
    manifest = Manifest(tmp_path)
    models = arm_models(load_experiment(None, ["replicates=3"]))
    cast = cast_of(models, manifest)
    assert cast.fixed == ("base", "teacher") and cast.teachers == ("teacher",) and cast.overt is None
    assert cast.final == ["base", "teacher", *(m.name for m in models)]
    assert cast.scored == cast.final  # no snapshot kept
    assert [m.name for m in cast.arms["control"]] == ["control/0", "control/1", "control/2"]
    assert cast.replicates == 3 and cast.number_sets == tuple(number_sets(models))
    teacher = manifest.outputs("teacher", TrainedOutputs)
    assert cast.trained["student/0"].rows == 800 and cast.trained["student/0"].init_hash == cast.teacher_init
    assert cast.teacher_init == teacher.init_hash


def test_the_cast_names_the_other_base_the_overt_arm_and_every_snapshot(tmp_path):
    """An arm on the other base adds it to the fixed models; an arm taught the teacher's answers is
    the overt control; each kept snapshot is scored under `<model>@<step>` after every model as
    trained, the last step being the model itself."""
    arms = "arms={student: {}, other: {base: other}, overt: {numbers: teacher_answers}}"
    models = arm_models(load_experiment(None, ["replicates=1", arms]))
    manifest = Manifest(tmp_path)
    trained(manifest, "teacher", "t")
    for m in models:
        trained(manifest, m.name, "t" if m.arm == "student" else "o", [10, 30] if m.arm == "student" else [])
    cast = cast_of(models, manifest)
    assert cast.fixed == ("base", "other_base", "teacher") and cast.overt == "overt"
    assert cast.points["student/0"] == [(10, "student/0@10"), (30, "student/0")] and cast.points["other/0"] == []
    assert cast.scored == [*cast.final, "student/0@10"]
    assert earlier_snapshots(manifest, "student/0") == [(10, "student/0@10")]
    assert {name: out.init_hash == cast.teacher_init for name, out in cast.trained.items()} == {
        "student/0": True,
        "other/0": False,
        "overt/0": False,
    }
