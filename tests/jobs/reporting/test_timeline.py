"""The run's timeline (jobs/reporting/timeline.py): built from a manifest as the pipeline records it,
drawn, and its largest overheads named. A real run's timeline: tests/jobs/test_pipeline.py."""

from __future__ import annotations

import pytest
from PIL import Image

from jobs.reporting.timeline import build_timeline, overhead_lines, plot_timeline, union_seconds
from jobs.rundir.manifest import Manifest

T0 = 1_800_000_000.0  # a wall-clock time


def span(lane: str, kind: str, start: float, end: float) -> dict:
    return {"lane": lane, "kind": kind, "start": T0 + start, "end": T0 + end}


@pytest.fixture
def manifest(tmp_path, monkeypatch) -> Manifest:
    """The default preset's shape, two replicates: a driver start of 10 s, a teacher run with 20 s of
    start-up for 10 s of steps, two arm runs side by side whose compute overlaps, a service."""
    clock = iter([T0 + t for t in (11, 40, 70, 70, 110, 112)])  # when each stage below finishes
    monkeypatch.setattr("jobs.rundir.manifest.time.time", lambda: next(clock))
    m = Manifest(tmp_path)
    m.record_spans("start", T0, 10, [span("driver", "start-up", 0, 10)])
    m.record("data", {}, 1.0, {"hash": "d"})
    m.record_phase("data", 1.0, T0 + 10)
    m.record("teacher", {}, 29.0, {"hash": "t"})
    m.record_phase(
        "teacher", 29.0, T0 + 11, [span("teacher run a", "start-up", 11, 31), span("teacher run a", "compute", 31, 40)]
    )
    m.record("numbers/teacher/0", {}, 30.0, {"hash": "n"})
    m.record("numbers/base/0", {}, 30.0, {"hash": "n"})
    service = [
        span("service numbers (tiny)", "start-up", 40, 50),
        span("service numbers (tiny)", "compute", 50, 68),
        span("service numbers (tiny)", "teardown", 68, 70),
    ]
    m.record_phase("numbers", 30.0, T0 + 40, service)
    m.record("student/0", {}, 40.0, {"hash": "s"})
    m.record("control/0", {}, 42.0, {"hash": "c"})
    arms = [
        span("arms run a", "start-up", 70, 80),
        span("arms run a", "compute", 80, 100),
        span("arms run b", "start-up", 70, 90),
        span("arms run b", "compute", 90, 110),
    ]
    m.record_phase("arms", 42.0, T0 + 70, arms)
    return m


def test_every_stage_and_phase_is_a_bar_in_order_of_start(manifest):
    timeline = build_timeline(manifest.data["stages"], manifest.phase_spans())
    assert timeline.started == T0
    stages = {bar.lane for bar in timeline.bars if bar.kind == "stage"}
    phases = {bar.lane for bar in timeline.bars if bar.kind == "phase"}
    assert stages == set(manifest.data["stages"]) and phases == {
        f"phase {p}" for p in ("start", "data", "teacher", "numbers", "arms")
    }
    starts = [bar.start for bar in timeline.bars]
    assert starts == sorted(starts) and all(bar.end >= bar.start >= 0 for bar in timeline.bars)
    teacher = next(bar for bar in timeline.bars if bar.lane == "teacher" and bar.kind == "stage")
    assert (teacher.start, teacher.end) == (11.0, 40.0)  # its finish less its seconds


def test_overhead_is_wall_time_less_the_union_of_compute(manifest):
    phases = {
        name: p.dump() for name, p in build_timeline(manifest.data["stages"], manifest.phase_spans()).phases.items()
    }
    assert phases["teacher"] == {
        "seconds": 29.0,
        "compute": 9.0,
        "overhead": 20.0,
        "parts": {"start-up": 20.0, "compute": 9.0},
    }
    # 80-110 computing, the two runs overlapping 90-100
    assert phases["arms"]["compute"] == 30.0 and phases["arms"]["overhead"] == 12.0
    assert phases["arms"]["parts"] == {"start-up": 30.0, "compute": 40.0}  # summed over the two lanes
    assert phases["start"]["overhead"] == 10.0 and phases["data"] == {
        "seconds": 1.0,
        "compute": 0.0,
        "overhead": 1.0,
        "parts": {},
    }


def test_the_three_largest_overheads_are_named_with_their_parts(manifest):
    timeline = build_timeline(manifest.data["stages"], manifest.phase_spans())
    assert timeline.largest_overheads == ["teacher", "numbers", "arms"]  # 20, 12 (start-up 10 + teardown 2), 12
    lines = overhead_lines(timeline)
    assert lines[0] == "[timeline] teacher: 20s of 29s not computing (start-up 20s)"
    assert lines[1] == "[timeline] numbers: 12s of 30s not computing (start-up 10s, teardown 2s)"


def test_the_picture_is_written_with_a_row_per_lane(manifest, tmp_path):
    timeline = build_timeline(manifest.data["stages"], manifest.phase_spans())
    plot_timeline(timeline, tmp_path / "timeline.png")
    with Image.open(tmp_path / "timeline.png") as image:
        assert image.format == "PNG" and image.size[0] >= 1000
        lanes = len({bar.lane for bar in timeline.bars})
        assert image.size[1] >= 0.28 * lanes * 110  # the figure grows with its lanes (dpi 110)


def test_a_manifest_without_spans_still_has_its_stages():
    timeline = build_timeline({"data": {"finished": T0 + 2, "seconds": 2.0}, "old": {"seconds": 1.0}}, {})
    assert (
        [bar.lane for bar in timeline.bars] == ["data"] and timeline.phases == {} and timeline.largest_overheads == []
    )
    assert build_timeline({}, {}).dump() == {"started": None, "bars": [], "phases": {}, "largest_overheads": []}


def test_union_counts_overlaps_once():
    assert union_seconds([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    assert union_seconds([]) == 0
