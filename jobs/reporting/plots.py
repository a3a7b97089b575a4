"""The report's plots, each written whole or not at all (common/atomic.py):

- `transfer.png`: the paired differences that answer the question, with their CIs;
- `accuracy.png`: held-out accuracy per model and subset with 95% intervals (an arm: its replicate mean);
- `training.png`: the loss of every optimizer step, for the teacher(s) and every arm model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.atomic import atomic_file
from jobs.experiment.arms import LOSSES  # train/axes.py's, through the experiment (reporting imports no train/)
from jobs.experiment.stages import TEACHERS, trained_folder
from jobs.reporting.schema import Report
from jobs.stats.evidence import SERIES, SPLITS
from jobs.stats.results import ByStep, Comparison, Result

TEACHER_STYLE = {"color": "black", "lw": 2.0}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    _pyplot().close(fig)


def _error_bar(ax, x, r: Result, y=None, color=None) -> None:
    """One result at x (or at value x, row y): a point with its 95% CI (none with one replicate);
    detected results are red (or, with a series' color, filled)."""
    lo, hi = r.ci95 or (r.value, r.value)
    err = [[r.value - lo], [hi - r.value]]
    style = (
        {"color": color, "mfc": color if r.detected else "white"}
        if color
        else {"color": "tab:red" if r.detected else "tab:blue"}
    )
    if y is None:
        ax.errorbar(x, r.value, yerr=err, fmt="o", capsize=3, **style)
    else:
        ax.errorbar(r.value, y, xerr=err, fmt="o", capsize=3, **style)


def _comparisons(report: Report) -> list[tuple[str, Comparison, ByStep | None]]:
    """(label, result, its series against steps or None) of every arm against its reference, then every contrast."""
    rows = [(f"{name} - {arm.against}", arm.transfer, arm.by_step) for name, arm in report.arms.items()]
    return rows + [(f"{c.arm} - {c.against}", c, c.by_step) for c in report.contrasts.values()]


def _forest(ax, rows: list, metric: str, split: str, labels: bool) -> None:
    """One row per comparison: its difference with the 95% CI."""
    for y, (_, result, _) in enumerate(rows):
        if result.cell(split, metric).value is not None:
            _error_bar(ax, None, result.cell(split, metric), y)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows] if labels else [""] * len(rows))
    ax.set_title(f"{metric}, {split}", fontsize=9)


def _series(ax, series: list, metric: str, split: str, legend: bool) -> None:
    """One line per comparison with snapshots: its difference at each step, with the 95% CIs."""
    for k, (label, points) in enumerate(series):
        shift = (k - (len(series) - 1) / 2) * 0.01 * max(max(p.steps) for p in points)  # bars side by side
        xs = [float(np.mean(p.steps)) + shift for p in points]
        (line,) = ax.plot(xs, [p.split(split).metrics[metric].value for p in points], label=label)
        for x, p in zip(xs, points):
            _error_bar(ax, x, p.split(split).metrics[metric], color=line.get_color())
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("optimizer step (filled: detected)", fontsize=8)
    if legend:
        ax.legend(fontsize=6)
    ax.set_title(f"{metric}, {split}, by step", fontsize=9)


def plot_transfer(report: Report, path: Path) -> None:
    """Paired differences with their 95% CIs (every arm against its reference, every contrast),
    per primary metric and split: the intervals that answer the question, not per-model ones.
    With snapshots, a second row of panels per metric shows each series against training steps."""
    plt = _pyplot()
    rows = _comparisons(report)
    series = [
        (label, by_step.points) for label, _, by_step in rows if by_step is not None and by_step.points is not None
    ]
    panels = [(metric, False) for metric in SERIES] + ([(metric, True) for metric in SERIES] if series else [])
    height = 1.2 + 0.45 * len(rows) * len(SERIES) + (3 * len(SERIES) if series else 0)
    fig, axes = plt.subplots(len(panels), len(SPLITS), figsize=(10, height), squeeze=False)
    for i, (metric, by_step) in enumerate(panels):
        for j, split in enumerate(SPLITS):
            if by_step:
                _series(axes[i][j], series, metric, split, legend=j == 0)
            else:
                _forest(axes[i][j], rows, metric, split, labels=j == 0)
    _save(fig, path)


def plot_accuracy(report: Report, path: Path) -> None:
    """Held-out accuracy per model and subset, bars with their 95% intervals (`ci95`,
    `ci95_by_subset`): base and teacher Wilson intervals, an arm its replicate mean with the
    report's interval for other seeds and questions, and its replicates as dots."""
    plt = _pyplot()
    models = report.models
    groups = ["overall"] + sorted({k for m in models.values() for k in m.accuracy if k != "overall"})
    names = list(models)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 + 1.1 * len(groups) * len(names) * 0.45), 4.5))
    for i, name in enumerate(names):
        m = models[name]
        xs = np.arange(len(groups)) + (i - (len(names) - 1) / 2) * width
        values = [m.accuracy.get(g, np.nan) for g in groups]
        cis = [m.ci95] + [(m.ci95_by_subset or {}).get(g) for g in groups[1:]]
        err = np.array(
            [[max(v - ci[0], 0.0), max(ci[1] - v, 0.0)] if ci else [0.0, 0.0] for v, ci in zip(values, cis)]
        ).T
        replicates = m.replicates or 1
        label = f"{name} (mean of {replicates})" if replicates > 1 else name
        style = {"color": "0.25"} if name == "teacher" else {}
        ax.bar(xs, values, width, yerr=err, capsize=3, label=label, **style)
        for r in report.arms[name].replicates if replicates > 1 and name in report.arms else []:
            ax.plot(xs, [r.accuracy.get(g, np.nan) for g in groups], "o", color="black", ms=2.5, zorder=3)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_xlabel("subset of the held-out questions")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("Held-out accuracy per model (bars: 95% CI; dots: an arm's replicates)", fontsize=10)
    ax.legend(fontsize=8, ncol=2)
    _save(fig, path)


def training_curves(run_dir: Path, report: Report) -> list[dict]:
    """One entry per trained model of the report: {model, arm (None for a teacher), loss (kind),
    steps, losses}, from `loss_history` in its adapter's `train_metrics.json` (empty where an
    adapter was trained before the history was kept)."""
    curves = []
    teachers = [name for name in TEACHERS if name in report.models]
    folders = [(name, None, "sft", run_dir / trained_folder(name)) for name in teachers]
    for arm, entry in report.arms.items():
        full = entry.method == "full"
        folders += [(r.model, arm, entry.loss, run_dir / trained_folder(r.model, full)) for r in entry.replicates]
    for model, arm, loss, folder in folders:
        history = json.loads((folder / "train_metrics.json").read_text()).get("loss_history", [])
        curves.append(
            {
                "model": model,
                "arm": arm,
                "loss": loss,
                "steps": [h[0] for h in history],
                "losses": [h[1] for h in history],
            }
        )
    return curves


PANEL_TITLES = {"teachers": "teacher(s): cross-entropy on the answer"} | {
    name: loss.title for name, loss in LOSSES.items()
}


def plot_training(curves: list[dict], path: Path) -> None:
    """Loss against optimizer step: one panel for the teacher(s), one per arm loss kind; an arm's
    replicates as thin lines in the arm's colour, their mean (over the steps all reached) thicker."""
    plt = _pyplot()
    panels = [("teachers", [c for c in curves if c["arm"] is None])]
    for kind in dict.fromkeys(c["loss"] for c in curves if c["arm"] is not None):
        panels.append((kind, [c for c in curves if c["arm"] is not None and c["loss"] == kind]))
    panels = [(title, members) for title, members in panels if members]
    colours = {arm: f"C{i}" for i, arm in enumerate(dict.fromkeys(c["arm"] for c in curves if c["arm"] is not None))}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, members) in zip(axes[0], panels):
        missing = [c["model"] for c in members if not c["steps"]]
        for arm in dict.fromkeys(c["arm"] for c in members):
            runs = [c for c in members if c["arm"] == arm and c["steps"]]
            if arm is None:
                for c in runs:
                    ax.plot(
                        c["steps"],
                        c["losses"],
                        label=c["model"],
                        **(TEACHER_STYLE if c["model"] == "teacher" else {"lw": 2.0}),
                    )
                continue
            for c in runs:
                ax.plot(c["steps"], c["losses"], color=colours[arm], lw=0.8, alpha=0.6)
            if runs:
                n = min(len(c["steps"]) for c in runs)
                mean = np.mean([c["losses"][:n] for c in runs], axis=0)
                ax.plot(
                    runs[0]["steps"][:n],
                    mean,
                    color=colours[arm],
                    lw=2.0,
                    label=f"{arm} (mean of {len(runs)}; thin: replicates)",
                )
        ax.set_title(PANEL_TITLES.get(title, f"arms ({title})"), fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss")
        if missing:
            ax.text(0.02, 0.02, "no loss history: " + ", ".join(missing), transform=ax.transAxes, fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("Training loss of every optimizer step (mean over the workers)", fontsize=11)
    _save(fig, path)
