"""Stop a replica's engine processes when the replica dies without stopping them.

vLLM 0.32 runs its engine core in a child process of the replica, and that process does not
watch its parent: a replica killed outright (SIGKILL, the OOM killer, `ray stop --force`) leaves
it running for good, holding its KV cache (CPU memory here; on a GPU, the GPU's memory, into the
next training stage). Measured here: an engine core left by `ray stop --force` was still alive,
with 0.75 GiB resident, 45 minutes later.

`guard_new_children()` starts a small watcher process beside the engine. It polls its parent (the
replica) once a second and, once the replica is gone, kills the processes it was handed. Each is
named by pid and start time, so a pid the system has reused since is never hit. A replica that
stops normally has already shut its engine down; the watcher then finds nothing to kill and exits.
"""

from __future__ import annotations

import subprocess
import sys

import psutil

WATCHER = """
import os, sys, time
import psutil

replica = int(sys.argv[1])
while os.getppid() == replica:
    time.sleep(1)
for arg in sys.argv[2:]:
    pid, started = arg.split("@")
    try:
        process = psutil.Process(int(pid))
        if abs(process.create_time() - float(started)) < 0.01:
            process.kill()
    except psutil.Error:
        pass
"""


def child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def guard_new_children(before: set[int]) -> subprocess.Popen | None:
    """Start the watcher over the processes this one has started since `before` (`child_pids()`
    taken just before the engine started: its engine core and, with tensor parallelism on CPU,
    its workers; on GPUs those are Ray actors in the replica's placement group, which Serve
    removes with the replica); None when there are none."""
    me = psutil.Process()
    targets = [
        f"{child.pid}@{child.create_time()!r}" for child in me.children(recursive=True) if child.pid not in before
    ]
    if not targets:
        return None
    return subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(me.pid), *targets], stdin=subprocess.DEVNULL, start_new_session=True
    )
