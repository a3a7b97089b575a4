"""The report phase on its own (jobs/phases/report.py): report.json, report.md and the pictures,
built from a small stored run whose scores plant a known transfer. Nothing is trained or served:
the run directory holds what the earlier phases would have left (manifest entries, per-question
scores, adapters saved with save_pretrained)."""

import json
import math
import shutil

import pytest
from PIL import Image

from common.atomic import write_jsonl
from jobs.experiment.arms import arm_models
from jobs.experiment.config import load_experiment
from jobs.phases.report import build_report, write_report
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest

N = 40  # held-out questions (as many train questions), two subsets
AGREE = {"student": 24, "control": 8}  # held-out questions on which each replicate picks the teacher's answer


def question(i: int, split: str) -> dict:
    return {
        "question": f"{split} question {i}",
        "choices": ["w", "x", "y", "z"],
        "answer": i % 4,
        "subset": ("bio", "cyber")[i % 2],
        "split": split,
    }


def scored(predictions: dict[str, list[int]]) -> list[dict]:
    """Rows as the evaluate phase writes them: 0.7 on the picked choice, 0.1 on each other."""
    rows = []
    for split, picks in predictions.items():
        for i, pick in enumerate(picks):
            logprobs = [math.log(0.7 if c == pick else 0.1) for c in range(4)]
            rows.append({**question(i, split), "prediction": pick, "logprobs": logprobs, "truncated_tokens": 0})
    return rows


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory, lora_adapters):
    """The default preset with 2 replicates: the teacher answers every question right, the base
    always picks the next letter (so it never agrees with the teacher), and replicate r of an arm
    agrees with the teacher on its first AGREE[arm] + r held-out questions, the base elsewhere."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_experiment(None, ["replicates=2"])
    models = arm_models(cfg)
    manifest = Manifest(run_dir)
    right = [i % 4 for i in range(N)]
    wrong = [(i + 1) % 4 for i in range(N)]
    scores = {"teacher": {"train": right, "held_out": right}, "base": {"train": wrong, "held_out": wrong}}
    for m in models:
        k = AGREE[m.arm] + m.replicate
        scores[m.name] = {"train": wrong, "held_out": right[:k] + wrong[k:]}
    for name, predictions in scores.items():
        write_jsonl(run_dir / "eval" / f"{name}.jsonl", scored(predictions))
    for name, adapter in [("teacher", "a")] + [(m.name, "a" if m.arm == "student" else "b") for m in models]:
        folder = run_dir / (name if name == "teacher" else f"arms/{name}") / "adapter"
        shutil.copytree(lora_adapters[adapter], folder)
        (folder / "train_metrics.json").write_text(
            json.dumps({"step": 3, "loss": 1.0, "loss_history": [[1, 2.0], [2, 1.5], [3, 1.0]]})
        )
    manifest.record(
        "teacher", {}, 1.0, {"hash": "t", "steps": 3, "loss": 1.0, "init_hash": "same", "rows": N, "snapshot_steps": []}
    )
    for source in ("teacher", "base"):
        for i in range(2):
            manifest.record(
                f"numbers/{source}/{i}",
                {},
                1.0,
                {"generated": 120, "kept": 100, "rejected": {"invalid format": 20}, "hash": "n"},
            )
    for m in models:
        init = "same" if m.arm == "student" else "other"
        manifest.record(
            m.name,
            {},
            1.0,
            {"hash": m.name, "steps": 3, "loss": 1.0, "init_hash": init, "rows": 100, "snapshot_steps": []},
        )
    for phase in ("data", "teacher", "numbers", "arms", "evaluate"):
        manifest.record_phase(phase, 2.5)
    report = build_report(run_dir, cfg, models, manifest, {"base": "tiny-model-path"})
    write_report(run_dir, report)
    return run_dir, report


def test_accuracy_and_agreement_are_counted_from_the_stored_scores(stored_run):
    _, report = stored_run
    assert report.models["teacher"].overall == 1.0 and report.models["base"].overall == 0.0
    assert report.models["teacher"].n == N and report.models["base"].accuracy_by_split == {
        "train": 0.0,
        "held_out": 0.0,
    }
    for arm, k in AGREE.items():
        replicates = report.arms[arm].replicates
        # the teacher is always right: agreement = accuracy
        assert [r.teacher_agreement for r in replicates] == [k / N, (k + 1) / N]
        assert [r.overall for r in replicates] == [k / N, (k + 1) / N]
        assert report.models[arm].overall == pytest.approx((k + 0.5) / N) and report.models[arm].replicates == 2
        assert report.arms[arm].mean.teacher_agreement == pytest.approx((k + 0.5) / N)


def test_the_planted_transfer_is_measured_with_its_interval_and_verdict(stored_run):
    _, report = stored_run
    planted = (AGREE["student"] - AGREE["control"]) / N
    transfer = report.transfer
    assert transfer.value == pytest.approx(planted) and transfer.replicate_pairs == 2
    assert transfer.ci95[0] < planted < transfer.ci95[1]
    student = report.arms["student"]
    assert student.against == "control" and report.arms["control"].against == "base"
    assert student.transfer.cell("held_out", "agreement").value == pytest.approx(planted)
    assert student.transfer.cell("train", "agreement").value == 0.0  # both arms pick the base's letters on train
    assert student.verdict.startswith("student vs control: ")


def test_the_weight_space_init_numbers_and_timings_come_from_the_run_directory(stored_run):
    _, report = stored_run
    student, control = report.arms["student"], report.arms["control"]
    assert all(r.update_cosine == pytest.approx(1.0) for r in student.replicates)  # the teacher's own adapter
    assert all(abs(r.update_cosine) < 0.5 for r in control.replicates)  # another random adapter
    assert [r.same_init_as_teacher for r in student.replicates + control.replicates] == [True, True, False, False]
    assert report.numbers["teacher"].generated == 240 and report.numbers["control"].rejected == {"invalid format": 40}
    assert report.timings == {phase: 2.5 for phase in ("data", "teacher", "numbers", "arms", "evaluate")}
    assert (
        report.truncated_questions == {"train": 0, "held_out": 0} and report.provenance.model_path == "tiny-model-path"
    )
    prior = report.letter_prior  # one order: the choices as written (answers i mod 4, so every letter equally often)
    assert (
        prior.orders == 1
        and prior.models["teacher"].prior == [0.25] * 4
        and prior.models["teacher"].accuracy_over_orders == 1.0
    )
    assert prior.models["base"].accuracy_over_orders == 0.0 and set(prior.models) == {
        "base",
        "teacher",
        *(f"{a}/{i}" for a in AGREE for i in (0, 1)),
    }


def test_report_md_and_the_pictures_are_written(stored_run):
    run_dir, report = stored_run
    assert (run_dir / "report.json").read_text() == json.dumps(report.dump(), indent=2) + "\n"
    # it loads back as built
    assert (
        json.dumps(Report.load(run_dir / "report.json").dump(), indent=2) + "\n"
        == (run_dir / "report.json").read_text()
    )
    markdown = (run_dir / "report.md").read_text()
    for model in ("base", "teacher", "student/0", "student/1", "control/0", "control/1"):
        assert f"| {model} |" in markdown
    assert (
        f"**Transfer** (held-out agreement with the teacher, student minus control, 2 replicate(s) each): {report.transfer.value:+.3f}"
        in markdown
    )
    assert "| teacher | 0.250 | 0.250 | 0.250 | 0.250 | 1.000 |" in markdown  # the letter prior table
    for picture in ("transfer.png", "accuracy.png", "training.png"):
        with Image.open(run_dir / picture) as image:
            assert image.format == "PNG" and min(image.size) > 200


def test_a_kept_run_is_reported_again_from_its_scores_alone(stored_run, tmp_path):
    """jobs/rebuild.py: the report.json and the packed scores and manifest are all a kept run holds;
    the report built again from them (no adapters: the weight readings come from the kept report)
    equals the kept one, and a kept figure that the scores do not give is named."""
    import tarfile

    from jobs.rebuild import differences, pack_scores, rebuild

    run_dir, report = stored_run
    kept = tmp_path / "kept"
    kept.mkdir()
    shutil.copyfile(run_dir / "report.json", kept / "report.json")
    pack_scores(run_dir, kept)
    again = tmp_path / "again"
    again.mkdir()
    # the same archive for the same files
    assert pack_scores(run_dir, again).read_bytes() == (kept / "scores.tar.gz").read_bytes()
    content = json.loads((kept / "report.json").read_text())
    rebuilt = json.loads(json.dumps(rebuild(kept).dump(), default=str))
    assert differences(content, rebuilt) == [] and rebuilt["arms"] == content["arms"]
    content["arms"]["student"]["transfer"]["held_out"]["agreement"]["value"] += 0.01
    del content["transfer"]["p_value"]  # a field the kept report lacks is no difference
    assert differences(content, rebuilt) == [
        f"arms.student.transfer.held_out.agreement.value: kept {content['arms']['student']['transfer']['held_out']['agreement']['value']!r}, rebuilt {rebuilt['arms']['student']['transfer']['held_out']['agreement']['value']!r}"
    ]

    with tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as tar:  # a member outside the scores
        tar.add(run_dir / "manifest.json", arcname="../manifest.json")
    (tmp_path / "bad.tar.gz").replace(kept / "scores.tar.gz")
    with pytest.raises(ValueError, match=r"not a scores archive: \.\./manifest\.json"):
        rebuild(kept)
