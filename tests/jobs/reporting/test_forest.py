"""jobs/reporting/forest.py: the forest plot of pooled pairs, drawn from real pooling results."""

import numpy as np
import pytest
from PIL import Image

from jobs.reporting.forest import plot_forest
from jobs.stats.pooling import pool

TAB_RED, TAB_BLUE = (214, 39, 40), (31, 119, 180)  # matplotlib's tab:red and tab:blue, the diamond's colours


def drawn(path) -> tuple[tuple[int, int], set]:
    """The PNG's size and the set of its pixel colours."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size, {pixel[:3] for pixel in image.convert("RGB").getdata()}


def test_a_forest_plot_per_pair_and_pooled(tmp_path):
    estimates, ses = [0.05, 0.03, 0.06, 0.02, 0.045, 0.07], [0.013, 0.017] * 3
    detected = pool(estimates, np.square(ses), [f"seed {k}" for k in range(6)])
    assert detected.p_value < 0.05
    out = plot_forest(detected, tmp_path / "forest.png", label="crossed rank, train", title="student vs sham twin")
    (width, height), colours = drawn(out)
    assert out == tmp_path / "forest.png" and 500 < width < 1500 and 200 < height < width
    assert TAB_RED in colours and TAB_BLUE not in colours
    assert not list(tmp_path.glob(".forest.png.tmp-*"))  # written whole

    null = pool([0.01, -0.02], [0.013**2, 0.017**2])
    (_, short), colours = drawn(plot_forest(null, tmp_path / "null.png"))
    assert short < height  # fewer pairs, a shorter plot
    assert TAB_BLUE in colours and TAB_RED not in colours


def test_pairs_that_agree_exactly_still_plot(tmp_path):
    """Plain HK gives no interval when q = 0: the diamond is a point and the figures say so."""
    result = pool([0.03] * 3, [0.015**2] * 3, test="hk")
    assert result.ci is None
    assert drawn(plot_forest(result, tmp_path / "flat.png"))[0][0] > 0


def test_bad_input_is_named(tmp_path):
    result = pool([0.05, 0.02], [0.013**2, 0.017**2])
    with pytest.raises(TypeError, match="Pooled"):
        plot_forest(result.to_dict(), tmp_path / "forest.png")
    with pytest.raises(ValueError, match=r"must end in \.png"):
        plot_forest(result, tmp_path / "forest.svg")
    assert not list(tmp_path.iterdir())
