"""One run directory, one pipeline: a second one stops at once naming the holder, and a dead holder frees it.

The holder is always a real second process (a `python -c` holding the lock, or
the test itself while a child tries); a dead holder is SIGKILLed by its own pid.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.rundir.manifest import LOCK_FILE, Manifest, RunDirError
from jobs.rundir.run_lock import check_free, hold_run_dir

ROOT = Path(__file__).resolve().parents[3]
HOLD = """
import sys, time
from pathlib import Path
from jobs.rundir.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""
TAKE = """
import sys
from pathlib import Path
from jobs.rundir.manifest import RunDirError
from jobs.rundir.run_lock import hold_run_dir
try:
    with hold_run_dir(Path(sys.argv[1])):
        print("taken")
except RunDirError as err:
    print(err)
"""


@pytest.fixture
def holder(tmp_path):
    """A second process holding `tmp_path / "run"` until the test kills it (or the test ends)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_a_second_taker_stops_at_once_naming_the_holder_and_a_killed_holder_frees_it(holder):
    run_dir, proc = holder
    started = time.monotonic()
    with pytest.raises(RunDirError) as taken:
        with hold_run_dir(run_dir):
            pass
    message = str(taken.value)
    assert f"pid {proc.pid} " in message and f"host {socket.gethostname()} " in message and " since 20" in message
    assert str(run_dir / LOCK_FILE) in message and time.monotonic() - started < 5
    with pytest.raises(RunDirError, match=f"pid {proc.pid} "):  # the early check sees it too, taking nothing
        check_free(run_dir)

    os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs: the kernel drops its lock with the process
    proc.wait()
    assert f"pid {proc.pid} " in (run_dir / LOCK_FILE).read_text()  # its line stays, naming a dead holder
    check_free(run_dir)
    with hold_run_dir(run_dir) as lock:
        assert f"pid {os.getpid()} " in lock.read_text()
    assert (run_dir / LOCK_FILE).read_text() == ""  # released: it names no holder
    check_free(run_dir)


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    """Taking the lock truncates the lock file: through a symlink it would empty the link's target."""
    run_dir, target = tmp_path / "run", tmp_path / "precious.txt"
    run_dir.mkdir()
    target.write_text("keep me\n")
    (run_dir / LOCK_FILE).symlink_to(target)
    for take in (lambda: hold_run_dir(run_dir).__enter__(), lambda: check_free(run_dir)):
        with pytest.raises(RunDirError, match="symbolic link"):
            take()
    assert target.read_text() == "keep me\n"


def test_a_run_directory_never_held_is_free_and_the_check_creates_nothing(tmp_path):
    check_free(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    with hold_run_dir(tmp_path / "new" / "run"):  # made, parents too
        assert (tmp_path / "new" / "run" / LOCK_FILE).is_file()


def test_fresh_clears_the_run_directory_but_keeps_it_held(tmp_path):
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir):
        (run_dir / "numbers" / "teacher").mkdir(parents=True)
        (run_dir / "numbers" / "teacher" / "0.jsonl").write_text("{}\n")
        (run_dir / "manifest.json").write_text('{"version": 1}')
        Manifest(run_dir, fresh=True)
        assert [p.name for p in run_dir.iterdir()] == [LOCK_FILE]
        other = subprocess.run(
            [sys.executable, "-c", TAKE, str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert f"pid {os.getpid()} " in other.stdout and "in use by another pipeline" in other.stdout, (
            other.stdout + other.stderr
        )
    other = subprocess.run(
        [sys.executable, "-c", TAKE, str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert other.stdout.strip() == "taken", other.stdout + other.stderr


def test_the_pipeline_refuses_a_run_directory_in_use_before_starting_ray(holder, cache_dir):
    run_dir, proc = holder
    env = {**os.environ, "SUBLIMINAL_CACHE": str(cache_dir)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert (
        done.stderr.startswith(f"error: run directory {run_dir} is in use by another pipeline (host ")
        and f"pid {proc.pid} " in done.stderr
    )
    assert "[placement]" not in done.stdout and "Traceback" not in done.stderr  # stopped before Ray and placement
    assert time.monotonic() - started < 120 and sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
    # --fresh does not delete a directory in use either; --plan only reads, so it needs no lock.
    fresh = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir), "--fresh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fresh.returncode == 2 and "in use by another pipeline" in fresh.stderr
    planned = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir), "--plan"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert planned.returncode == 0 and "stages to run" in planned.stdout, planned.stderr[-2000:]
