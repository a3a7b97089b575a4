"""serve.engine_guard with real processes: a "replica" that starts a long-lived child (as vLLM
starts its engine core) is SIGKILLed by its pid, and the guard kills that child; a child the
replica had before the guard started is left alone, and so is everything after a normal exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

REPLICA = """
import subprocess, sys, time
from serve.engine_guard import child_pids, guard_new_children

older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # started before the engine
before = child_pids()
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the engine core
guard = guard_new_children(before)
print(older.pid, engine.pid, guard.pid, flush=True)
if sys.argv[1] == "exit":
    engine.kill(); engine.wait()  # a normal stop shuts its engine down first
    sys.exit(0)
time.sleep(600)
"""


def start_replica(mode: str) -> tuple[subprocess.Popen, int, int, int]:
    replica = subprocess.Popen([sys.executable, "-c", REPLICA, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    older, engine, guard = map(int, replica.stdout.readline().split())
    return replica, older, engine, guard


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_a_replica_killed_outright_takes_its_engine_with_it():
    replica, older, engine, guard = start_replica("sleep")
    try:
        time.sleep(1.5)  # the guard is polling
        assert psutil.pid_exists(engine) and psutil.pid_exists(guard)
        os.kill(replica.pid, signal.SIGKILL)
        replica.wait()
        assert gone_within(engine, 10), "the engine outlived its replica"
        assert gone_within(guard, 10)
        assert psutil.pid_exists(older), "a process started before the engine was killed"
    finally:
        for pid in (older, engine, guard):
            if psutil.pid_exists(pid):
                psutil.Process(pid).kill()


def test_a_normal_stop_leaves_nothing_to_kill():
    replica, older, engine, guard = start_replica("exit")
    try:
        assert replica.wait(timeout=30) == 0
        assert gone_within(guard, 10) and psutil.pid_exists(older)
    finally:
        if psutil.pid_exists(older):
            psutil.Process(older).kill()
