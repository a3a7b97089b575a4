"""bench/gpu_job.py, the whole job on one GPU: on a machine without one it refuses at once, and so
does the preset it runs (before any work, naming each phase that needs a GPU). Its log reading is
tested on the real job log of the end-to-end run (tests/jobs/test_pipeline.py)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")


def test_the_command_refuses_without_a_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, "bench/gpu_job.py", "--out", str(tmp_path / "job.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr, done.stderr
    assert not (tmp_path / "job.json").exists()


@pytest.mark.slow  # starts Ray
def test_the_gpu_preset_names_what_it_needs_before_any_work(tmp_path):
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--config", "tiny-gpu", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    for phase in ("teacher", "student", "service", "evaluate"):
        assert f"- {phase}: " in done.stderr and "GPU" in done.stderr, done.stderr
    assert not (tmp_path / "run" / "manifest.json").exists()
