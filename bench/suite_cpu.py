"""Where the test suite's CPU goes: the machine's busy cores over a whole run, shared out among the tests running.

    .venv/bin/python bench/suite_cpu.py [--json OUT] -- bash .ci/run

Runs the command (the suite as CI runs it, or any `python -m pytest` command from the checkout) with
this file loaded into every pytest process it starts (`-p bench.suite_cpu` through PYTEST_ADDOPTS), which records each test's start and
end (setup to teardown) and its process. Beside it, the machine's busy share (psutil.cpu_percent) is read
every 2 s. Each reading's busy core-seconds are shared equally among the tests running then; readings
with no test running are counted apart (the install, the tiny base's build, collection).

What it says: how busy the two cores were (a suite that leaves cores idle is shortened by overlap; one
that does not, only by less work), and which modules the work is in. What it does not: a test that
mostly waits (a Serve health check) gets an equal share of what the other process computes
meanwhile, so the shares are of the machine's work while a test ran, not of its own.
BENCHMARKS.md, "Where the suite's CPU goes".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

LOG_ENV = "SUITE_CPU_LOG"  # where the plugin appends "pid start end nodeid" per test
SAMPLE_S = 2.0

try:  # the plugin half, loaded by pytest (`-p bench.suite_cpu`)
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        started = time.time()
        yield
        if os.environ.get(LOG_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(f"{os.getpid()} {started:.2f} {time.time():.2f} {item.nodeid}\n")

except ImportError:  # the tool half needs no pytest
    pass


def sample(readings: list, stop: threading.Event) -> None:
    """Append (time, busy cores of the whole machine since the last reading) every SAMPLE_S until `stop`."""
    cores = os.cpu_count() or 1
    psutil.cpu_percent()  # the first reading's start
    while not stop.wait(SAMPLE_S):
        readings.append((time.time(), cores * psutil.cpu_percent() / 100))


def attribute(readings: list, tests: list, origin: float) -> dict:
    """Busy and idle core-seconds in all, outside tests, by process and module, and the costliest tests;
    each process's first start and last end in seconds from `origin`."""
    cores = os.cpu_count() or 1
    by_process: dict[str, list] = collections.defaultdict(list)
    for t in tests:
        by_process[t["pid"]].append(t)
    shares: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)  # pid -> module -> core-s
    by_test: collections.Counter = collections.Counter()
    busy = idle = busy_outside = idle_outside = 0.0
    for at, busy_cores in readings:
        middle = at - SAMPLE_S / 2
        running = [t for t in tests if t["start"] <= middle <= t["end"]]
        busy += busy_cores * SAMPLE_S
        idle += (cores - busy_cores) * SAMPLE_S
        if not running:
            busy_outside += busy_cores * SAMPLE_S
            idle_outside += (cores - busy_cores) * SAMPLE_S
        for t in running:
            share = busy_cores * SAMPLE_S / len(running)
            shares[t["pid"]][t["nodeid"].split("::")[0]] += share
            by_test[t["nodeid"]] += share
    processes = {
        pid: {
            "tests": len(ran),
            "first_start": round(min(t["start"] for t in ran) - origin, 1),
            "last_end": round(max(t["end"] for t in ran) - origin, 1),
            "core_s": round(sum(shares[pid].values()), 1),
            "modules": {m: round(s, 1) for m, s in shares[pid].most_common()},
        }
        for pid, ran in by_process.items()
    }
    return {
        "busy_core_s": round(busy, 1),
        "idle_core_s": round(idle, 1),
        "outside_tests": {"busy_core_s": round(busy_outside, 1), "idle_core_s": round(idle_outside, 1)},
        "processes": processes,
        "costliest_tests": {name: round(s, 1) for name, s in by_test.most_common(30)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the result here as well")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command (default: bash .ci/run)")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] or ["bash", ".ci/run"]
    descriptor, name = tempfile.mkstemp(prefix="suite_cpu", suffix=".log")
    os.close(descriptor)
    log = Path(name)
    env = {
        **os.environ,
        LOG_ENV: str(log),
        "PYTEST_ADDOPTS": f"{os.environ.get('PYTEST_ADDOPTS', '')} -p bench.suite_cpu".strip(),
    }
    readings: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(readings, stop), daemon=True)
    started = time.time()
    sampler.start()
    status = subprocess.call(command, env=env)
    stop.set()
    sampler.join()
    tests = []
    for line in log.read_text().splitlines():
        pid, start, end, nodeid = line.split(" ", 3)
        tests.append({"pid": pid, "start": float(start), "end": float(end), "nodeid": nodeid})
    log.unlink()
    result = {"command": command, "exit_status": status, "wall_s": round(time.time() - started, 1)}
    result |= attribute(readings, tests, started)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
