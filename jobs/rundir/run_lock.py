"""One run directory, one pipeline: an exclusive lock on `<run dir>/.lock` while a pipeline uses it.

Two pipelines on one run directory would overwrite each other's outputs and
manifest, and the second would delete the first's Serve application as one
"left behind". So `Experiment.run` (jobs/pipeline.py) holds the directory from before it reads the
manifest until it returns, and a second pipeline stops at once with a
RunDirError naming the holder: its host, pid and start time, which the holder
writes into the lock file once it has the lock.

The lock is `flock(LOCK_EX | LOCK_NB)` on that file. The kernel drops it when
the holding process ends, however it ends (SIGKILL, the OOM killer, a crash),
so a dead holder never keeps the directory and there is nothing to clean up by
hand. The descriptor is opened close-on-exec (Python's default), so programs
the driver starts (a local Ray cluster, vLLM engines) do not inherit the lock
and cannot keep it after the driver is gone. On NFS, Linux maps flock onto NFS
byte-range locks, so the lock also holds between hosts sharing the directory.

The file itself is never deleted or replaced (a process opening it while it
was removed would lock a file no one else sees): `--fresh` clears the
directory around it (jobs/rundir/manifest.py `clear`), and the holder line is written
in place, not by an atomic rename.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobs.rundir.manifest import LOCK_FILE, RunDirError

WAIT_S = 1.0  # how long a taker retries before giving up: covers `check_free`'s instant and the holder writing its line


def holder_line() -> str:
    return f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S %z')}"


def _in_use(run_dir: Path, path: Path, fd: int) -> RunDirError:
    holder = os.pread(fd, 1024, 0).decode("utf-8", "replace").strip() or "a pipeline that has not written its line yet"
    return RunDirError(
        f"run directory {run_dir} is in use by another pipeline ({holder}); wait for it to end or stop it,"
        f" or use another --run-dir (lock file {path}; the lock goes with the process holding it)"
    )


def _lock(fd: int, operation: int, run_dir: Path, path: Path) -> None:
    """flock `fd` without blocking, retrying for WAIT_S; a RunDirError naming the holder if it stays taken."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise _in_use(run_dir, path, fd) from None
            time.sleep(0.05)


def _why(err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return "it is a symbolic link, which the lock never follows (it would truncate the link's target); remove it"
    return err.strerror or str(err)


def check_free(run_dir: Path) -> None:
    """Raise RunDirError when a live pipeline holds `run_dir`; take nothing and create nothing.

    For stopping early, before starting Ray or placing work: `hold_run_dir`
    is what keeps a second pipeline out.
    """
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return  # never held: nothing to check
    except OSError as err:
        raise RunDirError(f"cannot open the run directory's lock file {path}: {_why(err)}") from None
    try:
        _lock(fd, fcntl.LOCK_SH, run_dir, path)  # shared: probes do not stop one another
    finally:
        os.close(fd)  # and with it the shared lock


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[Path]:
    """Hold `run_dir` (created if needed) for this process until the block ends; yields the lock file.

    A RunDirError naming the holder if another process holds it.
    """
    path = run_dir / LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # a symlink there is refused, never truncated through
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise RunDirError(f"cannot create the run directory's lock file {path}: {_why(err)}") from None
    try:
        _lock(fd, fcntl.LOCK_EX, run_dir, path)
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_line() + "\n").encode(), 0)
        yield path
    finally:
        os.ftruncate(fd, 0)  # a released lock names no holder
        os.close(fd)  # releases the lock
