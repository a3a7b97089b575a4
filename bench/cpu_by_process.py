"""CPU seconds of every process a command starts, grouped by what each process is.

    .venv/bin/python bench/cpu_by_process.py [--json OUT] -- .venv/bin/python jobs/pipeline.py --run-dir DIR

While the command runs, every process on the machine started after it (the command itself, Ray's
processes, its workers and actors) is read every 0.3 s (psutil) and its last reading kept, so up
to 0.3 s of each process's CPU before it ends is missed, and a process that starts and ends
between two readings altogether (Ray's workers and actors live longer): the sums err low. Each is
named by its command line (Ray renames its workers `ray::<Actor class>`) and put in a group: Ray
Train's workers, Serve's replicas, Ray Train's and Ray Data's helper actors, Serve's controller and
proxy, Ray itself, the driver. Prints the groups, then every kind of process, with the command's
wall time and the CPU-seconds its cores had in it. Why: the timeline (report.json) says when a run
is not computing, not what the CPU did then; BENCHMARKS.md, "Where the default run's CPU goes".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import threading
import time

import psutil

# What each kind of process is, by the name Ray gives it (`ray::<Actor class>`; the kernel's copy of a
# renamed process's name keeps 15 characters, so a kind is matched on its first 10) or its program's.
GROUPS = {
    "Ray Train workers": ["RayTrainWorker"],
    "Serve replicas": ["ServeReplica"],
    "Ray Train's helper actors": [
        "TrainController",
        "DatasetManager",
        "TrainStateActor",
        "SynchronizationActor",
        "PreemptionWatcher",
        "PlacementGroupCleaner",
    ],
    "Ray Data's helper actors": ["_StatsActor", "_AutoscalingCoordinatorActor", "SplitCoordinator"],
    "Serve's controller and proxy": ["ServeController", "ProxyActor"],
    "idle Ray workers": ["ray::IDLE"],
    "Ray itself": [
        "gcs_server",
        "raylet/raylet",
        "DashboardAgent",
        "RuntimeEnvAgent",
        "ray-dashboard",
        "dashboard.py",
        "log_monitor",
        "monitor.py",
    ],
}
KINDS = {kind: name for name, kinds in GROUPS.items() for kind in kinds}


def kind(cmdline: list[str]) -> str:
    """A process's kind: one of KINDS found in its command line, else its program (a Python script's name)."""
    line = " ".join(cmdline)
    found = next((k for k in KINDS if k[:10] in line), None)
    if found:
        return found
    words = [w for w in cmdline[1:] if not w.startswith("-")] if "python" in cmdline[0] else []
    return os.path.basename(words[0] if words else cmdline[0])


def group(what: str, command_pid: int, pid: int) -> str:
    return "the driver" if pid == command_pid else KINDS.get(what, "other")


def measure(command: list[str]) -> dict:
    """Run `command`; {wall_s, cpu_capacity_s, exit_status, groups: {name: {cpu_s, processes}}, kinds: {...}}."""
    started = time.time()
    readings: dict[tuple[int, float], tuple[str, str, float]] = {}
    done = threading.Event()
    process = subprocess.Popen(command)

    def read() -> None:
        while not done.is_set():
            for p in psutil.process_iter(["cmdline", "create_time"]):
                try:
                    if p.info["create_time"] < started - 1 or p.pid == os.getpid():
                        continue
                    cpu = p.cpu_times()
                    what = kind(p.info["cmdline"] or [p.name()])
                    readings[(p.pid, p.info["create_time"])] = (
                        group(what, process.pid, p.pid),
                        what,
                        cpu.user + cpu.system,
                    )
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            time.sleep(0.3)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    status = process.wait()
    done.set()
    reader.join()
    wall = time.time() - started
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    kinds: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, what, cpu in readings.values():
        groups[name].update(cpu_s=cpu, processes=1)
        kinds[what].update(cpu_s=cpu, processes=1)

    def table(counts: dict) -> dict:
        return {
            k: {"cpu_s": round(v["cpu_s"], 1), "processes": v["processes"]}
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1]["cpu_s"])
        }

    return {
        "command": command,
        "exit_status": status,
        "wall_s": round(wall, 1),
        "cpu_capacity_s": round(wall * (os.cpu_count() or 1), 1),
        "cpu_s": round(sum(c for _, _, c in readings.values()), 1),
        "groups": table(groups),
        "kinds": table(kinds),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- and the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    result = measure(command)
    print(
        f"exit {result['exit_status']}, wall {result['wall_s']} s, "
        f"{result['cpu_s']} CPU-s of the {result['cpu_capacity_s']} its cores had"
    )
    for title in ("groups", "kinds"):
        print(f"{'CPU s':>8} {'procs':>5}  {title}")
        for name, row in result[title].items():
            print(f"{row['cpu_s']:8.1f} {row['processes']:5d}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result["exit_status"]


if __name__ == "__main__":
    raise SystemExit(main())
