"""Who holds the CPUs while a pipeline phase computes: CPU-seconds per process during each phase.

    python bench/cpu_shares.py --run-dir /tmp/run-cpu -- python -u jobs/pipeline.py --run-dir /tmp/run-cpu --fresh

Runs the command, reading every process's CPU time (user + system) every
`--every` seconds, then takes each phase's compute window from the run's
manifest (the timeline's spans: the first compute span's start to the last
one's end) and prints the CPU-seconds each kind of process used inside it, as a
share of one CPU. A process started inside the window counts from zero and is
marked `[new]`: its start-up (imports, a Python interpreter) is CPU the window
paid. Every process on the machine is read, so a local Ray cluster's own
processes (raylet, GCS, dashboard, actors) are all counted; run it on a quiet
machine, since another user's processes are counted too.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import time
from pathlib import Path

import psutil


def snapshot() -> dict[int, tuple[str, float]]:
    """{pid: (kind, CPU-seconds so far)} of every process now; kind is its name (a Ray actor's class),
    with its script for Python."""
    found = {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        with contextlib.suppress(psutil.Error, TypeError):
            name, cmd, times = proc.info["name"], proc.info["cmdline"] or [], proc.info["cpu_times"]
            script = next((Path(a).name for a in cmd[1:] if a.endswith(".py")), "") if name.startswith("python") else ""
            # an actor renames itself per method it runs
            name = name.split(".")[0] if name.startswith("ray::") else name
            found[proc.pid] = (f"{name} {script}".strip(), times.user + times.system)
    return found


def compute_windows(run_dir: Path) -> dict[str, tuple[float, float]]:
    """{phase: (first compute span's start, last one's end)} from the run's manifest."""
    spans = json.loads((run_dir / "manifest.json").read_text()).get("spans", {})
    windows = {}
    for phase, entry in spans.items():
        compute = [s for s in entry.get("spans", []) if s["kind"] == "compute"]
        if compute:
            windows[phase] = (min(s["start"] for s in compute), max(s["end"] for s in compute))
    return windows


def shares(samples: list[tuple[float, dict]], start: float, end: float) -> tuple[float, collections.Counter]:
    """(seconds between the samples that bound the window, CPU-seconds by kind within them)."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return 0.0, collections.Counter()
    (t0, first), (t1, last) = inside[0], inside[-1]
    used = collections.Counter()
    for pid, (kind, cpu) in last.items():
        if pid in first:  # a Ray actor renames itself while it runs a method: the pid is the process
            used[kind] += cpu - first[pid][1]
        else:
            used[kind + " [new]"] += cpu
    return t1 - t0, used


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="the run directory the command writes")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between reads")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    child, samples = subprocess.Popen(command), []
    while child.poll() is None:
        samples.append((time.time(), snapshot()))
        time.sleep(args.every)
    if child.returncode:
        return child.returncode
    cpus = psutil.cpu_count()
    for phase, (start, end) in compute_windows(args.run_dir).items():
        seconds, used = shares(samples, start, end)
        if not seconds:
            continue
        print(
            f"\n{phase}: compute window {seconds:.1f} s, {sum(used.values()):.1f} of {cpus * seconds:.1f} CPU-seconds used"
        )
        for kind, cpu in used.most_common(args.top):
            print(f"  {cpu:7.2f} CPU-s  {cpu / seconds:6.1%} of a CPU  {kind}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
