"""The forest plot of teacher–sham pairs pooled by jobs/stats/pooling.pool: one row per pair (its
estimate and CI, a square sized by its weight in the pooled estimate), the pooled estimate and CI
as a diamond (red when its p is below the result's alpha), a line at zero, and tau and I^2 in the
title. The right-hand axis repeats each row's figures, so the plot reads without the report.
"""

from __future__ import annotations

from pathlib import Path

from jobs.reporting.plots import _pyplot, _save
from jobs.stats.pooling import Pooled


def plot_forest(result: Pooled, path: Path | str, *, label: str = "effect", title: str | None = None) -> Path:
    """Write the forest plot of `result` to `path` (a .png, written whole or not at all); returns the
    path. label names the x axis (the metric); title, when given, leads the figures in the title."""
    if not isinstance(result, Pooled):
        raise TypeError(f"plot_forest: needs a jobs.stats.pooling.Pooled result, got {type(result).__name__}")
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"plot_forest: writes a PNG, so the path must end in .png, got {path}")
    plt = _pyplot()
    level = f"{100 * (1 - result.alpha):g}%"
    rows = len(result.pairs)
    fig, ax = plt.subplots(figsize=(7.5, 1.6 + 0.38 * (rows + 1)))
    heights = list(range(rows, 0, -1))  # the first pair on top, the pooled row at 0
    for y, row in zip(heights, result.pairs):
        ax.plot(row.ci, (y, y), color="black", lw=1.2)
        ax.plot(row.estimate, y, "s", color="black", ms=4 + 10 * row.weight**0.5)
    lo, hi = result.ci or (result.estimate, result.estimate)
    detected = result.p_value is not None and result.p_value < result.alpha
    ax.fill(
        (lo, result.estimate, hi, result.estimate), (0, 0.28, 0, -0.28), color="tab:red" if detected else "tab:blue"
    )
    ax.axvline(0, color="grey", ls="--", lw=1)
    ax.set_ylim(-0.8, rows + 0.8)
    ax.set_yticks([*heights, 0], [row.name for row in result.pairs] + ["pooled"])
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    pooled_ci = "no interval" if result.ci is None else f"[{lo:+.4f}, {hi:+.4f}]"
    right.set_yticks(
        [*heights, 0],
        [f"{r.estimate:+.4f} [{r.ci[0]:+.4f}, {r.ci[1]:+.4f}]" for r in result.pairs]
        + [f"{result.estimate:+.4f} {pooled_ci}"],
    )
    ax.set_xlabel(f"{label} ({level} CI)")
    p = "-" if result.p_value is None else f"{result.p_value:.3g}"
    figures = f"{result.n_pairs} pairs: tau {result.tau:.4f}, I\u00b2 {100 * result.i2:.0f}%, pooled p {p} ({result.test}, {result.tau2_method})"
    ax.set_title(f"{title}\n{figures}" if title else figures, fontsize=10)
    _save(fig, path)
    return path
