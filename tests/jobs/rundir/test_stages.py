"""Stage-level reuse: a change reruns exactly the stages that read it, with the reason.

These tests record every stage of the tiny experiment in a real manifest (with
stand-in outputs: what a stage wrote does not matter to the plan, only its hash and
kept count, in a record of its kind), then change one thing and check which stages
the plan runs.
"""

import gzip
import json
import os
from pathlib import Path

import pytest

from jobs.experiment.arms import arm_models
from jobs.experiment.config import load_experiment
from jobs.experiment.stages import experiment_stages
from jobs.rundir.manifest import Manifest, RunDirError, digest, read_jsonl
from jobs.rundir.plan import describe, plan, restate

PRESETS = Path(__file__).resolve().parents[3] / "jobs" / "presets"


def stages_for(*overrides):
    cfg = load_experiment(None, ["replicates=2", *overrides])
    return experiment_stages(cfg, arm_models(cfg), questions_hash="q0")


def write_output(path, stage_name):
    """Stand-in content in the run directory's real layout: an adapter is a folder of weights and
    config, a JSONL file holds rows, report.json an object."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name == "adapter":
        path.mkdir()
        (path / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
        (path / "adapter_config.json").write_text(json.dumps({"r": 8, "of": stage_name}))
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps({"row": i, "of": stage_name}) + "\n" for i in range(20)))
    else:
        path.write_text(json.dumps({"of": stage_name}))


def stand_in(stage, hash_: str, kept: int = 100) -> dict:
    """A stand-in outputs record of the stage's kind (`Stage.record`), as the manifest keeps it: its
    hash and kept count given, every other figure a placeholder."""
    figures = {
        "generated": kept,
        "kept": kept,
        "rejected": {},
        "right": kept,
        "tokens_replaced": 0,
        "tokens_unchanged": 0,
        "train": kept,
        "held_out": kept,
        "steps": 1,
        "loss": 1.0,
        "init_hash": None,
        "rows": kept,
        "accuracy": {"overall": 0.5},
        "ci95": [0.4, 0.6],
        "n": kept,
    }
    return stage.record(hash=hash_, **{k: v for k, v in figures.items() if k in stage.record.model_fields}).plain()


def finish(stages, manifest, kept=100):
    """Record every stage as finished, writing its output files, as a real run would."""
    for stage in stages:
        for f in stage.files:
            write_output(manifest.run_dir / f, stage.name)
        inputs = stage.inputs(manifest)
        manifest.record(stage.name, inputs, 1.0, stand_in(stage, digest(stage.name, inputs), kept), stage.files)


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


def test_changing_the_primary_test_reruns_only_the_report(tmp_path):
    manifest = finished_run(tmp_path)
    assert runs(stages_for("evaluate.primary_metric=agreement"), manifest) == {
        "report": "evaluate.primary_metric: 'teacher_answer_rank' -> 'agreement'"
    }


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


def test_an_sgd_arm_trains_alone_and_reads_its_momentum(tmp_path):
    manifest = finished_run(tmp_path)
    arms = "arms={student: {numbers: teacher}, control: {numbers: base}, sgd: {train: {optimizer: sgd, lr: 0.05}}}"
    todo = runs(stages_for(arms), manifest)
    assert set(todo) == {"sgd/0", "sgd/1", "eval/sgd/0", "eval/sgd/1", "report"}
    stages = {s.name: s for s in stages_for(arms)}
    assert stages["sgd/0"].reads["train.optimizer"] == "sgd" and stages["sgd/0"].reads["train.momentum"] == 0.9
    finish([s for s in stages_for(arms) if s.name in todo], manifest)
    changed = runs(stages_for(arms, "arms.sgd.train.momentum=0.5"), manifest)
    assert set(changed) == set(todo) and changed["sgd/0"] == "train.momentum: 0.9 -> 0.5"


def test_a_fully_fine_tuned_arm_declares_its_model_folder(tmp_path):
    manifest = finished_run(tmp_path)
    arms = "arms={student: {numbers: teacher}, control: {numbers: base}, full: {train: {method: full, lr: 1.0e-4}}}"
    assert set(runs(stages_for(arms), manifest)) == {"full/0", "full/1", "eval/full/0", "eval/full/1", "report"}
    stages = {s.name: s for s in stages_for(arms)}
    assert stages["full/0"].reads["train.method"] == "full" and stages["full/0"].files == ("arms/full/0/model",)
    assert stages["student/0"].files == ("arms/student/0/adapter",)


PACING_SETTINGS = (
    "teacher.log_every=1",
    "teacher.checkpoint_every=7",
    "student.keep_checkpoints=5",
    "student.max_failures=0",
    "teacher.cpus_per_worker=3",
)


def test_settings_that_only_pace_training_rerun_nothing(tmp_path):
    """Logging, checkpoint cadence and retention, retries and CPUs per worker never change what a
    fine-tune makes (train/config.py PACING): no stage reads them."""
    manifest = finished_run(tmp_path)
    assert runs(stages_for(*PACING_SETTINGS), manifest) == {}
    assert not any(key.endswith(("log_every", "cpus_per_worker")) for s in stages_for() for key in s.reads)


def test_a_key_added_after_a_stage_ran_is_read_at_its_default(tmp_path):
    """A stored stage lacks a key the code added later: at the key's default the stage is reused (and
    `restate` records its inputs as read now), set away from it the stage reruns, naming the key."""
    finished_run(tmp_path)
    recorded = json.loads((tmp_path / "manifest.json").read_text())
    for name in ("teacher", "student/0"):  # as if written before `momentum` existed, with a key no longer read
        inputs = recorded["stages"][name]["inputs"]
        momentum = next(key for key in inputs if key.endswith(".momentum"))
        del inputs[momentum]
        inputs[momentum.replace("momentum", "log_every")] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(recorded))
    manifest = Manifest(tmp_path)
    assert runs(stages_for(), manifest) == {}
    todo = runs(stages_for("teacher.momentum=0.5"), manifest)
    # through the teacher's numbers
    assert todo["teacher"] == "teacher.momentum: '(none)' -> 0.5" and "student/0" in todo
    assert restate(plan(stages_for(), manifest), manifest) == ["teacher", "student/0"]
    stages = {s.name: s for s in stages_for()}
    again = Manifest(tmp_path)
    assert (
        again.entry("teacher")["inputs"] == stages["teacher"].inputs(again)
        and restate(plan(stages_for(), again), again) == []
    )


BEFORE_IDENTITY = json.loads(
    gzip.decompress((Path(__file__).parent / "data" / "stage_reads_before_identity.json.gz").read_bytes())
)
# Presets whose experiment changed since those reads were recorded, loaded as they were then: every
# one computed natively on a tiny base built natively (the pinned CPU numerics came later), the 8B
# presets without packing.
PACKED = ("llama-8b.yaml", "llama-8b-quick.yaml")
PRESET_AS_RECORDED = {
    name: ["numerics=native", "model.tiny_numerics=native"]
    + (["teacher.pack_length=null", "student.pack_length=null"] if name in PACKED else [])
    for name in BEFORE_IDENTITY
}


@pytest.mark.parametrize("preset", [PRESETS / name for name in sorted(BEFORE_IDENTITY)], ids=lambda p: p.name)
def test_stages_stored_under_the_earlier_identity_are_reused(tmp_path, preset):
    """data/stage_reads_before_identity.json.gz holds the stage reads of every preset shipped then
    (tiny-gpu came later) as the code before this identity (commit 44c5c6e) recorded them: whole config
    sections, PACING included, keys added later left out at their defaults. A run directory recorded
    that way reuses every stage, and is restated to the reads declared now."""
    before = BEFORE_IDENTITY
    cfg = load_experiment(preset, PRESET_AS_RECORDED.get(preset.name, []))
    stages = experiment_stages(cfg, arm_models(cfg), questions_hash="questions")
    assert {s.name for s in stages} == set(before[preset.name])
    manifest = Manifest(tmp_path)
    for stage in stages:
        for f in stage.files:
            write_output(tmp_path / f, stage.name)
        inputs = {
            **before[preset.name][stage.name],
            **{k: v for k, v in stage.inputs(manifest).items() if k not in stage.reads},
        }
        manifest.record(stage.name, inputs, 1.0, stand_in(stage, digest(stage.name)), stage.files)
    decisions = plan(stages, Manifest(tmp_path))
    assert [s.name for s, run, _ in decisions if run] == []
    assert restate(decisions, manifest) and restate(plan(stages, manifest), manifest) == []


def test_stages_computed_natively_run_again_under_pinned_numerics(tmp_path):
    """The pinned mode makes another tiny base and other floats: every stage that reads the model
    runs again, the data split (no model read) and the report's own reads aside; a stage recorded
    before the key existed counts as native."""
    manifest = Manifest(tmp_path)
    finish(stages_for("numerics=native"), manifest)
    pinned = stages_for("numerics=reproducible")
    todo = runs(pinned, Manifest(tmp_path))
    assert "data" not in todo and todo["teacher"] == "numerics: 'native' -> 'reproducible'"
    assert {s.name for s in pinned if "numerics" in s.reads} <= set(todo)
    assert runs(stages_for("numerics=native"), Manifest(tmp_path)) == {}


def test_stages_made_on_a_natively_built_tiny_base_run_again_on_the_pinned_one(tmp_path):
    """The tiny base is built pinned by default (model.tiny_numerics): a run directory made on the
    base built natively (explicitly, or recorded before the key existed) runs every stage that
    reads the model again, the data split aside; a hub model's stages do not read the key."""
    manifest = Manifest(tmp_path)
    finish(stages_for("model.tiny_numerics=native"), manifest)
    todo = runs(stages_for(), Manifest(tmp_path))
    assert (
        "data" not in todo
        and todo["teacher"] == "model.tiny_numerics: 'native' -> 'reproducible'"
        and "eval/student/1" in todo
    )
    recorded = json.loads((tmp_path / "manifest.json").read_text())
    for entry in recorded["stages"].values():  # as written before the key existed
        entry["inputs"].pop("model.tiny_numerics", None)
    (tmp_path / "manifest.json").write_text(json.dumps(recorded))
    # read as native
    assert runs(stages_for(), Manifest(tmp_path))["teacher"] == "model.tiny_numerics: '(none)' -> 'reproducible'"
    assert all("model.tiny_numerics" not in s.reads for s in stages_for("model.path=meta-llama/Llama-3.1-8B-Instruct"))


def test_scoring_in_more_orders_reruns_evaluation_and_report_only(tmp_path):
    manifest = Manifest(tmp_path)
    finish(stages_for("evaluate.format=letters", "evaluate.permutations=1"), manifest)
    todo = runs(stages_for("evaluate.format=letters", "evaluate.permutations=2"), Manifest(tmp_path))
    assert {name.split("/")[0] for name in todo} == {"eval", "report"}
    assert todo["eval/base"] == "evaluate.permutations: 1 -> 2" and "eval/student/1" in todo
    # Under cloze no order enters a prompt: more orders change nothing, and nothing reruns.
    assert runs(stages_for("evaluate.permutations=1"), finished_run(tmp_path / "cloze")) == {}


def test_adding_a_replicate_makes_only_that_replicate(tmp_path):
    manifest = finished_run(tmp_path)
    todo = runs(stages_for("replicates=3"), manifest)
    expected = {
        "numbers/teacher/2",
        "numbers/base/2",
        "student/2",
        "control/2",
        "eval/student/2",
        "eval/control/2",
        "report",
    }
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
    manifest.record(
        "numbers/base/0",
        stages["numbers/base/0"].inputs(manifest),
        1.0,
        stand_in(stages["numbers/base/0"], "new", kept=60),
    )
    todo = runs(list(stages.values()), manifest)
    assert "rows: 100 -> 60" in todo["student/0"] and "control/0" in todo and "student/1" not in todo


def test_a_missing_output_reruns_its_stage(tmp_path):
    manifest = finished_run(tmp_path)
    (tmp_path / "eval" / "teacher.jsonl").unlink()
    assert runs(stages_for(), manifest) == {
        "eval/teacher": "output eval/teacher.jsonl is missing",
        "report": "upstream eval/teacher runs",
    }


def test_a_manifest_of_an_older_version_reruns_everything(tmp_path):
    (tmp_path / "manifest.json").write_text('{"config": {}, "stages": {"data": {"inputs": "abc"}}}')
    assert set(runs(stages_for(), Manifest(tmp_path))) == {stage.name for stage in stages_for()}


def test_a_logit_kl_arm_and_the_positive_control_depend_on_their_teachers(tmp_path):
    arms = "arms={student: {}, control: {numbers: base}, kl: {loss: logit_kl}, positive: {loss: logit_kl, teacher: letter_teacher}}"
    arms = (arms, "evaluate.format=letters")  # the letter teacher's format
    manifest = Manifest(tmp_path)
    finish(stages_for(*arms), manifest)
    # The letter teacher's letter reruns it and the arm distilling it, not the real teacher's arms.
    todo = runs(stages_for(*arms, "letter_teacher.letter=B"), Manifest(tmp_path))
    assert set(todo) == {
        "letter_teacher",
        "positive/0",
        "positive/1",
        "eval/letter_teacher",
        "eval/positive/0",
        "eval/positive/1",
        "report",
    }
    assert todo["letter_teacher"] == "letter_teacher.letter: 'A' -> 'B'"
    # A new teacher setting reruns the KL arms through the teacher as well as through its numbers.
    todo = runs(stages_for(*arms, "teacher.lr=0.001"), Manifest(tmp_path))
    assert {"kl/0", "positive/0", "student/0", "letter_teacher"} <= set(todo) and "control/0" not in todo


DAMAGED = {  # a file of each kind -> the stage that wrote it
    "data/held_out.jsonl": "data",
    "teacher/adapter/adapter_model.safetensors": "teacher",
    "numbers/teacher/0.jsonl": "numbers/teacher/0",
    "arms/student/1/adapter/adapter_model.safetensors": "student/1",
    "eval/control/0.jsonl": "eval/control/0",
    "report.json": "report",
}


def downstream(stages, name) -> set[str]:
    """`name` and every stage that reads it, directly or not."""
    found = {name}
    for stage in stages:
        if found & set(stage.upstream):
            found.add(stage.name)
    return found


@pytest.mark.parametrize("damage", ["truncated", "a byte changed"])
@pytest.mark.parametrize("path", DAMAGED)
def test_a_damaged_output_reruns_its_stage_and_what_reads_it(tmp_path, path, damage):
    finished_run(tmp_path)
    target = tmp_path / path
    data = target.read_bytes()
    target.write_bytes(
        data[: len(data) // 2] if damage == "truncated" else data[:10] + bytes([data[10] ^ 1]) + data[11:]
    )
    stages = stages_for()
    todo = runs(stages, Manifest(tmp_path))
    assert todo[DAMAGED[path]] == f"output {path} changed since it was written"
    assert set(todo) == downstream(stages, DAMAGED[path])


def test_a_file_missing_from_an_adapter_folder_reruns_its_stage(tmp_path):
    finished_run(tmp_path)
    (tmp_path / "teacher" / "adapter" / "adapter_config.json").unlink()
    todo = runs(stages_for(), Manifest(tmp_path))
    assert todo["teacher"] == "output teacher/adapter/adapter_config.json is missing" and "numbers/base/0" not in todo


def test_an_unreadable_output_reruns_its_stage(tmp_path):
    finished_run(tmp_path)
    (tmp_path / "eval" / "base.jsonl").unlink()
    (tmp_path / "eval" / "base.jsonl").mkdir()  # there, but not a file that can be read
    assert runs(stages_for(), Manifest(tmp_path))["eval/base"].startswith("output eval/base.jsonl cannot be read (")


def test_an_output_rewritten_with_the_same_content_is_reused(tmp_path):
    finished_run(tmp_path)
    target = tmp_path / "numbers" / "teacher" / "0.jsonl"
    content = target.read_bytes()
    target.unlink()
    target.write_bytes(content)  # a copy of the run directory: new inode and time, same bytes
    assert runs(stages_for(), Manifest(tmp_path)) == {}


def test_entries_recorded_without_file_digests_are_still_reused(tmp_path):
    """Manifests from before outputs were hashed keep working: their files are checked for existence."""
    manifest = Manifest(tmp_path)
    stages = stages_for()
    finish(stages, manifest)
    recorded = json.loads((tmp_path / "manifest.json").read_text())
    for entry in recorded["stages"].values():
        del entry["files"]
    (tmp_path / "manifest.json").write_text(json.dumps(recorded))
    assert runs(stages, Manifest(tmp_path)) == {}


def test_the_plan_hashes_each_output_once_per_run_and_again_when_it_changes(tmp_path):
    """A pipeline plans once per phase: a file whose inode, size and mtime are as when this process
    hashed it is not read again; one replaced (an atomic rewrite: a new inode) is; a new process
    (a rerun) hashes everything."""
    manifest = finished_run(tmp_path)
    stages = stages_for()
    assert runs(stages, manifest) == {}
    target = tmp_path / "eval" / "base.jsonl"
    before = target.stat()
    with open(target, "r+b") as f:  # same size, same inode, and the old mtime put back
        f.write(b"[")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert runs(stages, manifest) == {}  # not read again in this process
    assert runs(stages, Manifest(tmp_path))["eval/base"] == "output eval/base.jsonl changed since it was written"
    replacement = target.with_name("new")
    replacement.write_bytes(target.read_bytes())
    replacement.replace(target)
    assert runs(stages, manifest)["eval/base"] == "output eval/base.jsonl changed since it was written"


MANIFEST_NAMING = (
    b'{"version": 2, "stages": {"data": {"inputs": {}, "outputs": {"hash": "a"}, "files": {"%s": "x"}}}, "phases": {}}'
)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'{"version": 2, "stages": {"data": {"inputs"', "is not valid JSON"),  # cut short
        (b"", "is not valid JSON"),
        (b'{"version": 2, "stages": {}, "phases": {}}\xff', "cannot be read"),  # not UTF-8
        (b'[{"version": 2}]', "is not a run manifest: a JSON list, not an object"),
        (b'{"version": 2, "phases": {}}', "is not a run manifest: 'stages' is missing or not an object"),
        (
            b'{"version": 2, "stages": {"data": 1}, "phases": {}}',
            "is not a run manifest: stage 'data' is not an object",
        ),
        (
            b'{"version": 2, "stages": {"data": {"outputs": {"hash": "a"}}}, "phases": {}}',
            "stage 'data': 'inputs' is missing",
        ),
        (
            b'{"version": 2, "stages": {"data": {"inputs": {}, "outputs": {}}}, "phases": {}}',
            "stage 'data': its outputs have no 'hash'",
        ),
        (
            MANIFEST_NAMING % b"../../etc/passwd",
            "stage 'data': file '../../etc/passwd' is not a path inside the run directory",
        ),
        (MANIFEST_NAMING % b"/etc/passwd", "stage 'data': file '/etc/passwd' is not a path inside the run directory"),
    ],
)
def test_a_damaged_manifest_is_an_error_naming_it(tmp_path, content, problem):
    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(RunDirError) as err:
        Manifest(tmp_path)
    assert (
        str(err.value).startswith(f"{tmp_path / 'manifest.json'} ")
        and problem in str(err.value)
        and "--fresh" in str(err.value)
    )


def test_an_output_replaced_by_a_link_out_of_the_run_directory_is_not_read(tmp_path):
    """The manifest's files are read back for their digests: a symlink swapped in for one leads
    nowhere outside the run directory; the stage reruns instead."""
    finished_run(tmp_path)
    target = tmp_path / "eval" / "base.jsonl"
    outside = tmp_path.parent / f"{tmp_path.name}-outside.jsonl"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)
    assert (
        runs(stages_for(), Manifest(tmp_path))["eval/base"]
        == "output eval/base.jsonl leads out of the run directory (a symbolic link)"
    )


def test_a_damaged_manifest_of_a_finished_run_is_an_error_not_a_rerun(tmp_path):
    finished_run(tmp_path)
    path = tmp_path / "manifest.json"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(RunDirError, match="manifest.json is not valid JSON"):
        Manifest(tmp_path)


def test_reading_back_a_jsonl_file_cut_mid_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "numbers.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3')
    with pytest.raises(RunDirError, match=f"^{path} line 3 is not valid JSON \\(.*\\): the file is damaged"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_retraining_a_damaged_adapter_is_a_new_training_run(tmp_path):
    """A training stage rerun with the same inputs (its adapter was damaged) must not resume its old
    Ray Train run: that run is finished, and the trainer would keep the damaged folder as its output.
    An interrupted first run keeps its name, so it resumes."""
    from jobs.runtime.training_runs import run_name

    manifest = Manifest(tmp_path)
    stages = {s.name: s for s in stages_for()}
    finish([stages["data"]], manifest)
    first = run_name(manifest, "teacher", [stages["teacher"]])
    assert run_name(manifest, "teacher", [stages["teacher"]]) == first  # interrupted: resumed under the same name
    finish([stages["teacher"]], manifest)
    assert run_name(manifest, "teacher", [stages["teacher"]]) != first


def test_an_arm_on_the_other_base_adds_that_base_and_reruns_with_it(tmp_path):
    arms = "arms={student: {}, control: {numbers: base}, far: {base: other, loss: logit_kl}}"
    manifest = Manifest(tmp_path)
    finish(stages_for(arms), manifest)
    stages = {s.name: s for s in stages_for(arms)}
    assert "eval/other_base" in stages and stages["far/0"].upstream == ("numbers/teacher/0", "teacher")
    # Another tiny seed is another other base: its scores and the arms on it rerun, with the reason.
    todo = runs(stages_for(arms, "model.tiny_seed=1"), Manifest(tmp_path))
    assert "base: 'tiny:" in todo["eval/other_base"] and "far/0" in todo
    # An arm on the teacher's base reads no other base: declaring one leaves existing arms' plans alone.
    assert "base" not in stages["student/0"].reads and "base" not in stages["eval/base"].reads


def test_a_run_directory_made_before_the_layout_change_reruns_from_the_new_world(tmp_path):
    """tests/data/manifest_before_layout.json is the manifest of the default run (`python
    jobs/pipeline.py`) written by the code before jobs/ became packages. The stages declared now
    have the same names, phases and output files; the synthetic questions are world v3's, so its
    data stage, and everything after it, reruns (on world v2 every stage was reused)."""

    from jobs.phases import PHASES
    from jobs.sources.wmdp import load_wmdp

    stored = Path(__file__).resolve().parents[2] / "data" / "manifest_before_layout.json"
    (tmp_path / "manifest.json").write_bytes(stored.read_bytes())
    manifest, recorded = Manifest(tmp_path), json.loads(stored.read_text())
    cfg = load_experiment(None, [])
    questions = load_wmdp(cfg.data.source, tuple(cfg.data.subsets), tmp_path / "cache")
    stages = experiment_stages(cfg, arm_models(cfg), digest(questions))
    assert {s.name for s in stages} == set(recorded["stages"]) and list(PHASES) == list(recorded["phases"])
    assert "data" in runs(stages, manifest) and stages[0].inputs(manifest) != recorded["stages"]["data"]["inputs"]
    for stage in stages:
        entry = recorded["stages"][stage.name]
        # known is new; a folder is recorded file by file
        for declared in [f for f in stage.files if f != "data/known.jsonl"]:
            assert any(f == declared or f.startswith(declared + "/") for f in entry["files"]), (stage.name, declared)
