"""The storage check (jobs/runtime/storage_reach.py) against a node that really cannot see the run
directory: a worker raylet started in a mount namespace of its own (`unshare --mount`, root only)
with an empty tmpfs over the run directory's parent, beside a worker node that sees it, joined to
a head node. The pipeline, pointed at that cluster, must stop before any work naming that node
alone."""

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import free_port, head_node, stop_head

ROOT = Path(__file__).resolve().parents[3]
RAY = str(Path(sys.executable).parent / "ray")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("unshare"), reason="a mount namespace of its own needs root and unshare"
    ),
]


def node_id(temp_dir: str) -> str:
    """The node id of the raylet whose --temp-dir this is: Ray names its session's port files after it."""
    (port_file,) = Path(temp_dir, "session_latest").glob("metrics_export_port_*")
    return port_file.name.rsplit("_", 1)[1]


@contextmanager
def worker_node(address: str, hide: Path | None = None):
    """A worker raylet of 1 CPU joined to `address` (`ray start`); with `hide`, in its own mount
    namespace with an empty tmpfs over that folder, so it sees none of what the driver has there.
    Yields its node id; stops only its own processes (found by its temp dir)."""
    temp_dir = tempfile.mkdtemp(prefix="rw", dir="/tmp")  # short: Ray's socket paths live under it
    start = [
        RAY,
        "start",
        f"--address={address}",
        "--num-cpus=1",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--metrics-export-port={free_port()}",
    ]
    if hide is not None:  # the namespace lives as long as the raylet's processes; the tmpfs goes with it
        start = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            'mount -t tmpfs hidden "$0" && exec "$@"',
            str(hide),
            *start,
        ]
    try:
        started = subprocess.run(
            start, capture_output=True, text=True, timeout=180, env={**os.environ, "RAY_AUTH_MODE": "token"}
        )
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield node_id(temp_dir)
    finally:
        stop_head(temp_dir)


def test_a_node_that_cannot_see_the_run_directory_is_named_before_any_work(tmp_path, cache_dir):
    run_dir = tmp_path / "runs" / "tiny"
    run_dir.parent.mkdir()
    with (
        head_node("--include-dashboard=false") as head,
        worker_node(head["address"]) as seeing,
        worker_node(head["address"], hide=run_dir.parent) as blind,
    ):
        env = {
            **os.environ,
            "SUBLIMINAL_CACHE": str(cache_dir),
            "RAY_ADDRESS": head["address"],
            "RAY_AUTH_MODE": "token",
        }
        done = subprocess.run(
            [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        head_id = node_id(head["temp_dir"])
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    refusal = done.stderr
    assert f"node {blind} (" in refusal and f"does not see {run_dir}" in refusal, refusal
    assert seeing not in refusal and head_id not in refusal, refusal  # the nodes that see it are not named
    assert "[storage]" not in done.stdout and "[plan]" not in done.stdout, done.stdout[-3000:]  # nothing planned or run
    # no manifest, no stage, no marker left behind
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "ray_train"]
    assert list((run_dir / "ray_train").iterdir()) == []
