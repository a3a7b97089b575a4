"""The pipeline across Ray nodes: a smoke run on a head and three worker nodes (bench/multinode.py).

A head of 0 CPUs, where the driver runs, and three worker nodes of 1 CPU each, each a raylet of
its own (`ray.cluster_utils.Cluster`). From those sizes alone, with no placement code of the
test's, the training workers of each training phase land on two nodes and no Serve replica on the
driver's node; the storage check at start hears from all four nodes; the run finishes its report.
The preset is cut down (one replicate, one teacher epoch, 128 prompts: 92-95 s alone on 2 cores) to fit
the suite's budget: the whole tiny preset across nodes, its report equal to the one-node run's, and
a node killed mid-phase are the bench's own runs (BENCHMARKS.md, "Many nodes").

Serve's one proxy is on the head, on a free port: the suite's session cluster holds 8000.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import stop_head

ROOT = Path(__file__).resolve().parents[1]
CUT_DOWN = ("teacher.epochs=1", "replicates=1", "numbers.prompts=128", "numbers.keep=64")

pytestmark = pytest.mark.slow


def test_the_pipeline_spreads_over_three_worker_nodes_and_finishes(tmp_path, tiny_model, cache_dir):
    sets = [arg for pair in CUT_DOWN for arg in ("--set", pair)]
    cluster_files = tempfile.mkdtemp(prefix="mnt", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        done = subprocess.run(
            [sys.executable, "bench/multinode.py", "--no-reference", "--out", str(tmp_path), *sets],
            cwd=ROOT,
            env={**os.environ, "SUBLIMINAL_CACHE": str(cache_dir), "RAY_TMPDIR": cluster_files},
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:  # a bench killed at the timeout leaves its pipeline's driver (its run is under tmp_path) and any node process
        stop_head(cluster_files)
        stop_head(str(tmp_path))
        shutil.rmtree(cluster_files, ignore_errors=True)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["nodes"]) == {"head", "worker1", "worker2", "worker3"} and result["driver_node"] == "head"
    assert "[storage] 4 node(s) see" in log, log[-4000:]
    phases = result["phases"]
    assert list(phases) == ["teacher", "numbers", "arms", "evaluate"], phases
    for phase in ("teacher", "arms"):
        workers = phases[phase]["train_workers"]
        assert len(workers) >= 2 and "head" not in workers, phases
    for phase in ("numbers", "evaluate"):
        assert phases[phase]["replicas"] and "head" not in phases[phase]["replicas"], phases
    report = json.loads((tmp_path / "multi-node" / "report.json").read_text())
    assert set(report["models"]) == {"base", "teacher", "student", "control"}
