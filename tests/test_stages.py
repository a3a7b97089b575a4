"""Stage-level reuse: a change reruns exactly the stages that read it, with the reason.

These tests record every stage of the tiny experiment in a real manifest (with
stand-in outputs: what a stage wrote does not matter to the plan, only its hash),
then change one thing and check which stages the plan runs.
"""

from jobs.arms import arm_models
from jobs.config import load_experiment
from jobs.graph import experiment_stages
from jobs.manifest import Manifest, digest
from jobs.stages import describe, plan


def stages_for(*overrides):
    cfg = load_experiment(None, ["replicates=2", *overrides])
    return experiment_stages(cfg, arm_models(cfg), questions_hash="q0")


def finish(stages, manifest, kept=100):
    """Record every stage as finished, writing its output files, as a real run would."""
    for stage in stages:
        for f in stage.files:
            (manifest.run_dir / f).parent.mkdir(parents=True, exist_ok=True)
            (manifest.run_dir / f).write_text("x")
        inputs = stage.inputs(manifest)
        manifest.record(stage.name, inputs, 1.0, {"hash": digest(stage.name, inputs), "kept": kept})


def runs(stages, manifest) -> dict[str, str]:
    return {stage.name: reason for stage, run, reason in plan(stages, manifest) if run}


def finished_run(tmp_path):
    manifest = Manifest(tmp_path)
    finish(stages_for(), manifest)
    return Manifest(tmp_path)  # read back from disk, as a rerun does


def test_a_finished_run_reuses_every_stage(tmp_path):
    manifest = finished_run(tmp_path)
    decisions = plan(stages_for(), manifest)
    assert not [s.name for s, run, _ in decisions if run]
    assert "0 of" in describe(decisions) and "reuse" in describe(decisions)


def test_a_new_run_directory_runs_everything(tmp_path):
    stages = stages_for()
    assert set(runs(stages, Manifest(tmp_path))) == {s.name for s in stages}


def test_changing_the_bootstrap_reruns_only_the_report(tmp_path):
    manifest = finished_run(tmp_path)
    assert runs(stages_for("evaluate.bootstrap=500"), manifest) == {"report": "evaluate.bootstrap: 1000 -> 500"}


def test_changing_the_scoring_engine_reruns_evaluation_and_report(tmp_path):
    manifest = finished_run(tmp_path)
    todo = runs(stages_for("evaluate.engine=vllm"), manifest)
    assert set(todo) == {s for s in todo if s.startswith("eval/")} | {"report"} and "eval/base" in todo
    assert "evaluate.engine: 'hf' -> 'vllm'" in todo["eval/base"]


def test_placement_settings_rerun_nothing(tmp_path):
    manifest = finished_run(tmp_path)
    assert runs(stages_for("evaluate.replicas=4", "service.replicas=2", "evaluate.chunk=32"), manifest) == {}


def test_adding_an_arm_trains_only_that_arm(tmp_path):
    manifest = finished_run(tmp_path)
    arms = "arms={student: {numbers: teacher}, control: {numbers: base}, other: {lora_seed: other}}"
    todo = runs(stages_for(arms), manifest)
    assert set(todo) == {"other/0", "other/1", "eval/other/0", "eval/other/1", "report"}
    assert todo["other/0"] == "not run before"


def test_adding_a_replicate_makes_only_that_replicate(tmp_path):
    manifest = finished_run(tmp_path)
    todo = runs(stages_for("replicates=3"), manifest)
    expected = {"numbers/teacher/2", "numbers/base/2", "student/2", "control/2", "eval/student/2", "eval/control/2", "report"}
    assert set(todo) == expected


def test_changing_the_teacher_reruns_what_depends_on_it_only(tmp_path):
    manifest = finished_run(tmp_path)
    todo = runs(stages_for("teacher.lr=0.001"), manifest)
    assert todo["teacher"] == "teacher.lr: 0.002 -> 0.001"
    assert {"numbers/teacher/0", "student/0", "eval/teacher", "eval/student/1", "report"} <= set(todo)
    assert not {"data", "numbers/base/0", "control/0", "eval/base", "eval/control/0"} & set(todo)


def test_changing_a_student_setting_retrains_the_arms_not_their_numbers(tmp_path):
    manifest = finished_run(tmp_path)
    todo = runs(stages_for("student.lr=0.01"), manifest)
    assert todo["student/0"] == "train.lr: 0.002 -> 0.01"
    assert not [name for name in todo if name.startswith(("numbers/", "teacher", "data"))]


def test_fewer_kept_numbers_retrains_every_arm_of_that_replicate(tmp_path):
    """Arms of a replicate train on equally many rows: if one source keeps fewer, all of them rerun."""
    manifest = finished_run(tmp_path)
    stages = {s.name: s for s in stages_for()}
    manifest.record("numbers/base/0", stages["numbers/base/0"].inputs(manifest), 1.0, {"hash": "new", "kept": 60})
    todo = runs(list(stages.values()), manifest)
    assert "rows: 100 -> 60" in todo["student/0"] and "control/0" in todo and "student/1" not in todo


def test_a_missing_output_reruns_its_stage(tmp_path):
    manifest = finished_run(tmp_path)
    (tmp_path / "eval" / "teacher.jsonl").unlink()
    assert runs(stages_for(), manifest) == {"eval/teacher": "output eval/teacher.jsonl is missing", "report": "upstream eval/teacher runs"}


def test_a_manifest_of_an_older_version_reruns_everything(tmp_path):
    (tmp_path / "manifest.json").write_text('{"config": {}, "stages": {"data": {"inputs": "abc"}}}')
    assert "data" in runs(stages_for(), Manifest(tmp_path))


def test_a_logit_kl_arm_and_the_positive_control_depend_on_their_teachers(tmp_path):
    arms = "arms={student: {}, control: {numbers: base}, kl: {loss: logit_kl}, positive: {loss: logit_kl, teacher: letter_teacher}}"
    manifest = Manifest(tmp_path)
    finish(stages_for(arms), manifest)
    # The letter teacher's letter reruns it and the arm distilling it, not the real teacher's arms.
    todo = runs(stages_for(arms, "letter_teacher.letter=B"), Manifest(tmp_path))
    assert set(todo) == {"letter_teacher", "positive/0", "positive/1", "eval/letter_teacher", "eval/positive/0", "eval/positive/1", "report"}
    assert todo["letter_teacher"] == "letter_teacher.letter: 'A' -> 'B'"
    # A new teacher setting reruns the KL arms through the teacher as well as through its numbers.
    todo = runs(stages_for(arms, "teacher.lr=0.001"), Manifest(tmp_path))
    assert {"kl/0", "positive/0", "student/0", "letter_teacher"} <= set(todo) and "control/0" not in todo
