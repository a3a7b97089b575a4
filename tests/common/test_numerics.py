"""Pinned CPU numerics (common/numerics.py): the variables reach a fresh process before its torch
loads, and torch, oneMKL and the thread count there are what the mode says; Ray's processes in
tests/jobs/test_numerics_ray.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import numerics

ROOT = Path(__file__).resolve().parents[2]

# What a process sees: the mode as torch runs under it, torch's kernels, oneMKL's branch as oneMKL
# itself reports it (mkl_serv_cbwr_get, exported by torch's library; None where it is not), threads.
SEES = """
import ctypes, json, os, sys, torch
from common import numerics
def mkl_branch():
    try:
        get = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    return {1: "OFF", 2: "AUTO", 3: "COMPATIBLE"}.get(get(1), get(1))  # MKL_CBWR_BRANCH; mkl_cbwr.h's values
torch.ones(64, 64) @ torch.ones(64, 64)
print(json.dumps({"loaded": numerics.loaded(), "capability": torch.backends.cpu.get_cpu_capability(), "mkl": mkl_branch(),
                  "threads": torch.get_num_threads(), "env": {k: os.environ.get(k) for k in [numerics.ENV, *numerics.PINNED]}}))
"""


def sees(code: str, env: dict, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_environment_of_each_mode():
    base = {"PATH": "/bin", numerics.ENV: "native"}
    pinned = numerics.environ("reproducible", base)
    assert pinned == base | numerics.PINNED | {numerics.ENV: "reproducible"}
    assert numerics.environ("native", pinned) == base  # a pinned parent's variables go, nothing else
    assert numerics.environ("native", base | {"MKL_CBWR": "AVX2"})["MKL_CBWR"] == "AVX2"  # a user's own value stays
    with pytest.raises(numerics.NumericsError, match="MKL_CBWR=COMPATIBLE, and the environment has MKL_CBWR=AVX2"):
        numerics.environ("reproducible", base | {"MKL_CBWR": "AVX2"})
    with pytest.raises(numerics.NumericsError, match="'fast' is not a mode"):
        numerics.environ("fast", base)


def test_ray_gets_the_variables_the_job_does_not_set_itself():
    assert numerics.ray_env_vars("reproducible") == {numerics.ENV: "reproducible", **numerics.PINNED}
    assert numerics.ray_env_vars("native") == {numerics.ENV: "native"}
    assert "MKL_CBWR" not in numerics.ray_env_vars("reproducible", taken={"MKL_CBWR"})


def test_a_pinned_process_computes_as_an_avx2_machine_with_mkls_compatible_branch():
    """Set before torch loads, every variable takes: torch's kernels at AVX2 (on an AVX-512 machine
    too), oneMKL on its COMPATIBLE branch; a native process on this machine's own path."""
    pinned = sees(SEES, numerics.environ("reproducible"))
    assert pinned["loaded"] == "reproducible" and pinned["capability"] in ("AVX2", "DEFAULT")
    assert pinned["mkl"] in ("COMPATIBLE", None)
    native = sees(SEES, numerics.environ("native"))
    assert native["loaded"] == "native" and native["mkl"] != "COMPATIBLE"
    if numerics.cpu()["vector_width"] == "AVX-512":
        assert native["capability"] == "AVX512"


def test_a_command_whose_torch_is_loaded_runs_again_under_the_mode_asked():
    """`enter` in a process that loaded torch natively: its own command again, pinned, THREADS threads."""
    code = "import sys, torch\nfrom common import numerics\nnumerics.enter(sys.argv[1], reexec=True)\n" + SEES
    seen = sees(code, numerics.environ("native"), "native")
    assert seen["loaded"] == "native" and seen["threads"] == numerics.threads("native")
    seen = sees(code, numerics.environ("native"), "reproducible")
    assert (
        seen["loaded"] == "reproducible"
        and seen["threads"] == numerics.THREADS
        and seen["env"]["MKL_CBWR"] == "COMPATIBLE"
    )


def test_a_process_that_cannot_run_again_refuses_another_mode():
    code = "import torch\nfrom common import numerics\ntry:\n    numerics.enter('reproducible', reexec=False)\nexcept numerics.NumericsError as e:\n    print(e)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=numerics.environ("native") | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "already loaded under native" in done.stdout, done.stdout + done.stderr


def test_the_cpu_is_named_with_its_vector_width():
    found = numerics.cpu()
    assert (
        found["model"] and found["vector_width"] in ("AVX-512", "AVX2") or found["vector_width"].startswith("no AVX2")
    )
    line = numerics.log_line("reproducible")
    assert line.startswith("[numerics] reproducible: ") and found["model"] in line and "COMPATIBLE" in line
    assert numerics.describe("native") == {"mode": "native", "cpu": found, "threads": os.cpu_count()}
