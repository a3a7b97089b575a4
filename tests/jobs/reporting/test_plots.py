"""The report's accuracy and training plots, drawn by matplotlib from report-shaped data and adapter folders."""

import json

import pytest
from PIL import Image

from jobs.reporting.plots import plot_accuracy, plot_training, training_curves
from jobs.reporting.schema import Accuracy, Arm, Report


def adapter(run_dir, folder: str, history: list | None) -> None:
    """An adapter folder's train_metrics.json as the trainer writes it (without `loss_history` when None)."""
    path = run_dir / folder / "adapter"
    path.mkdir(parents=True)
    metrics = {"step": 3, "loss": 1.0} | ({"loss_history": history} if history is not None else {})
    (path / "train_metrics.json").write_text(json.dumps(metrics))


def report_of(arms: dict[str, int]) -> Report:
    """A report's models and arms as jobs/phases/report.py builds them, for arms {name: replicates}
    (the sections the plots do not read left out: model_construct, not a whole report)."""
    subsets = {"bio": [0.2, 0.4], "chem": [0.1, 0.3]}
    fixed = {
        "accuracy": {"overall": 0.3, "bio": 0.3, "chem": 0.2},
        "ci95": [0.25, 0.35],
        "ci95_by_subset": subsets,
        "n": 200,
    }
    teacher = {
        **fixed,
        "accuracy": {"overall": 0.9, "bio": 0.95, "chem": 0.85},
        "ci95": [0.85, 0.95],
        "ci95_by_subset": {"bio": [0.9, 1.0], "chem": [0.8, 0.9]},
    }
    models = {"base": Accuracy.model_validate(fixed), "teacher": Accuracy.model_validate(teacher)}
    out = {}
    for arm, n in arms.items():
        ci = [0.2, 0.4] if n > 1 else None
        models[arm] = Accuracy.model_validate(
            {**fixed, "ci95": ci, "ci95_by_subset": {s: ci for s in subsets}, "replicates": n}
        )
        replicates = [
            {
                "model": f"{arm}/{i}",
                "accuracy": {"overall": 0.3 + i / 100, "bio": 0.3, "chem": 0.2},
                "n": 200,
                "same_init_as_teacher": True,
                "steps": 3,
            }
            for i in range(n)
        ]
        declared = {
            "numbers": "teacher",
            "loss": "logit_kl" if arm == "logits" else "sft",
            "teacher": "teacher",
            "base": "base",
            "lora_init": "seed",
        }
        out[arm] = Arm.model_validate(
            {
                **declared,
                "replicates": replicates,
                "method": "lora",
                "mean": models[arm],
                "against": "base",
                "reference": "base model",
                "verdict": "-",
            }
        )
    return Report.model_construct(models=models, arms=out)


def png_size(path) -> tuple[int, int]:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_training_curves_come_from_each_adapters_loss_history(tmp_path):
    report = report_of({"student": 2, "logits": 1})
    adapter(tmp_path, "teacher", [[1, 0.7], [2, 0.5], [3, 0.4]])
    adapter(tmp_path, "arms/student/0", [[1, 2.6], [2, 2.5]])
    adapter(tmp_path, "arms/student/1", [[1, 2.7], [2, 2.4], [3, 2.3]])
    adapter(tmp_path, "arms/logits/0", None)  # trained before the history was kept
    curves = {c["model"]: c for c in training_curves(tmp_path, report)}
    assert set(curves) == {"teacher", "student/0", "student/1", "logits/0"}
    assert curves["teacher"] == {
        "model": "teacher",
        "arm": None,
        "loss": "sft",
        "steps": [1, 2, 3],
        "losses": [0.7, 0.5, 0.4],
    }
    assert curves["student/1"]["arm"] == "student" and curves["student/1"]["losses"] == [2.7, 2.4, 2.3]
    assert curves["logits/0"]["loss"] == "logit_kl" and curves["logits/0"]["steps"] == []

    plot_training(list(curves.values()), tmp_path / "training.png")
    width, height = png_size(tmp_path / "training.png")
    assert width > 3 * height / 2  # three panels side by side: teachers, sft arms, logit_kl arms
    assert not list(tmp_path.glob(".training.png.tmp-*"))


@pytest.mark.parametrize("arms", [{"student": 3, "control": 3}, {"student": 1}])
def test_the_accuracy_plot_draws_every_model_with_or_without_intervals(tmp_path, arms):
    plot_accuracy(report_of(arms), tmp_path / "accuracy.png")
    width, height = png_size(tmp_path / "accuracy.png")
    assert width >= 700 and height >= 400
