"""Where a run's minutes went: report.json's `timeline` section and `timeline.png`.

Every stage the manifest holds is a bar from its start to its finish, every
phase a bar around its stages, and inside the phases the spans the pipeline
recorded while they ran (jobs/runtime/spans.py): a training run's start-up (Ray
Train's controller, its worker processes, their imports and process group),
its model load, each job's wait for its first batch, its compute and its save,
the run's teardown; a Serve application's start-up (replicas started, models
loaded), the work it served, its teardown; the driver's own start before the
first phase. All on one time axis, in seconds from the earliest bar.

A phase's overhead is its wall time less its compute (the union of its
`compute` spans): what starting and stopping things and waiting between them
cost. `largest_overheads` names the three largest, and the job log's last lines
print them. A stage reused from an earlier invocation keeps the times it ran
at, so a resumed run's timeline has gaps between invocations.
"""

from __future__ import annotations

from pathlib import Path

from jobs.reporting.plots import _pyplot, _save
from jobs.reporting.schema import Timeline

KINDS = ("start-up", "prepare", "model load", "data wait", "compute", "save", "teardown")  # a span's kinds
COLORS = {
    "stage": "#4c72b0",
    "phase": "#8172b3",
    "start-up": "#dd8452",
    "prepare": "#937860",
    "model load": "#da8bc3",
    "data wait": "#ccb974",
    "compute": "#55a868",
    "save": "#64b5cd",
    "teardown": "#c44e52",
}


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end] intervals (parallel lanes' compute counted once)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def phase_summary(seconds: float, spans: list[dict]) -> dict:
    """One phase's wall seconds, compute seconds, overhead and each kind's seconds (summed over lanes)."""
    compute = min(seconds, union_seconds([(s["start"], s["end"]) for s in spans if s["kind"] == "compute"]))
    parts: dict[str, float] = {}
    for s in spans:
        parts[s["kind"]] = round(parts.get(s["kind"], 0.0) + s["end"] - s["start"], 2)
    return {
        "seconds": round(seconds, 2),
        "compute": round(compute, 2),
        "overhead": round(seconds - compute, 2),
        "parts": parts,
    }


def build_timeline(stages: dict, phase_spans: dict) -> Timeline:
    """The `timeline` section from the manifest's stage entries ({name: entry with `finished` and
    `seconds`}) and its recorded phases ({phase: {started, seconds, spans}})."""
    raw = []  # (lane, kind, start, end) in wall-clock seconds
    for name, entry in stages.items():
        if "finished" in entry and "seconds" in entry:
            raw.append((name, "stage", entry["finished"] - entry["seconds"], entry["finished"]))
    phases = {}
    for phase, recorded in phase_spans.items():
        started, seconds = recorded["started"], recorded["seconds"]
        # not the lane of a stage named as the phase
        raw.append((f"phase {phase}", "phase", started, started + seconds))
        raw += [(s["lane"], s["kind"], s["start"], s["end"]) for s in recorded["spans"]]
        phases[phase] = phase_summary(seconds, recorded["spans"])
    if not raw:
        return Timeline(started=None, bars=[], phases={}, largest_overheads=[])
    origin = min(start for _, _, start, _ in raw)
    bars = [
        {"lane": lane, "kind": kind, "start": round(start - origin, 2), "end": round(end - origin, 2)}
        for lane, kind, start, end in sorted(raw, key=lambda bar: (bar[2], bar[0]))
    ]
    largest = sorted(phases, key=lambda p: phases[p]["overhead"], reverse=True)[:3]
    return Timeline(started=origin, bars=bars, phases=phases, largest_overheads=largest)


def overhead_lines(timeline: Timeline) -> list[str]:
    """The job log's last lines: the three largest overheads, each with its parts."""
    lines = []
    for phase in timeline.largest_overheads:
        p = timeline.phases[phase]
        parts = ", ".join(
            f"{kind} {s:.0f}s" for kind, s in sorted(p.parts.items(), key=lambda kv: -kv[1]) if kind != "compute"
        )
        lines.append(
            f"[timeline] {phase}: {p.overhead:.0f}s of {p.seconds:.0f}s not computing ({parts or 'no spans recorded'})"
        )
    return lines


def plot_timeline(timeline: Timeline, path: Path) -> None:
    """One row per lane (phases, then the spans' lanes, then stages, each in order of first start),
    a bar per stage, phase or span, coloured by kind, on one time axis."""
    plt = _pyplot()
    lanes: list[str] = []
    for order in ("phase", "span", "stage"):
        for bar in timeline.bars:
            group = bar.kind if bar.kind in ("phase", "stage") else "span"
            if group == order and bar.lane not in lanes:
                lanes.append(bar.lane)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.28 * max(len(lanes), 1)))
    for bar in timeline.bars:
        row = lanes.index(bar.lane)
        ax.barh(row, max(bar.end - bar.start, 0.05), left=bar.start, height=0.7, color=COLORS.get(bar.kind, "grey"))
    ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the run's first start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("phase", "stage", *KINDS)]
    ax.legend(
        handles,
        ["phase", "stage", *KINDS],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 / len(lanes) - 0.04),
        ncol=9,
    )
    ax.set_title("Where the run's time went (report.json: timeline)")
    _save(fig, path)
