"""Shared fixtures: one tiny model per test session (copied into the cache once) and one local Ray cluster."""

import contextlib
import os
import tempfile
from pathlib import Path

import pytest

from common import numerics

# The suite computes as the pipeline does by default (native CPU numerics; SUBLIMINAL_NUMERICS=reproducible
# pins them), set before anything loads torch (common/numerics.py); Ray clusters the tests start inherit them.
# The tiny base is the pinned one whatever the suite's mode (jobs/sources/shipped_base.py): one world.
numerics.pin(os.environ.get(numerics.ENV, numerics.DEFAULT))
# Tests share the user's cache (the tiny base and the bases tests build) unless CI points it elsewhere.
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
# Serve kills a starting proxy that has not answered its readiness check within 5 s, and `serve run` then dies on
# its ActorDiedError. Beside the other test process and two busy loops, the 2-core machine took longer than that
# to start one: 30 s. Every cluster the suite starts inherits this (its controller reads it).
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")
# Pipeline runs register their designs in a file of the suite's own, never the checkout's results/registry.jsonl.
os.environ["SUBLIMINAL_REGISTRY"] = str(Path(tempfile.mkdtemp(prefix="subliminal-registry-")) / "registry.jsonl")
# the suite tracks into its own stores, not a user's server
for _name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
    os.environ.pop(_name, None)


def pytest_collection_modifyitems(config, items):
    """Tests on a Ray cluster (the session's or a head node) are `slow` (`pytest -m "not slow"` is the quick loop); GPU tests
    are skipped without CUDA."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if {"ray_cluster", "ray_head", "ray_head_with_gpus", "keyed_head"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if skip and "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def make_number_rows():
    """A maker of `{prompt, completion}` rows of random number sequences in the tiny model's chat
    format: make(count, seed, completion_lengths=(1, 9)), each completion of low to high-1 numbers."""
    import numpy as np

    def make(count: int, seed: int, completion_lengths: tuple[int, int] = (1, 9)) -> list[dict]:
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(count):
            seen, more = (
                rng.integers(0, 1000, rng.integers(2, 8)),
                rng.integers(0, 1000, rng.integers(*completion_lengths)),
            )
            prompt = "<|user|>\nContinue the sequence: {}\n<|assistant|>\n".format(", ".join(map(str, seen)))
            rows.append({"prompt": prompt, "completion": ", ".join(map(str, more))})
        return rows

    return make


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    from common.files import default_cache_dir

    return default_cache_dir()


@pytest.fixture(scope="session")
def tiny_model(cache_dir) -> str:
    from jobs.sources.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model(root=cache_dir))


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster sized like the 2-core CI machine."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def free_port() -> int:
    """A TCP port free on loopback now (another process may take it before it is bound)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_head(temp_dir: str) -> None:
    """Kill a head node's processes (those naming its temp dir) and their children: the raylet's agents
    rename themselves (`ray::DashboardAgent`, about 15% of a core each), so their command lines do not
    name the dir. Never another cluster's."""
    import psutil

    mine = [p for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or ())]
    for process in list(mine):
        with contextlib.suppress(psutil.NoSuchProcess):
            mine += process.children(recursive=True)
    for process in set(mine):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(set(mine), timeout=30)


@contextlib.contextmanager
def head_node(*extra_args: str, env: dict | None = None):
    """A real head node (`ray start --head`, with its dashboard) outliving its drivers, as on a
    cluster: {"address", "dashboard" (URL), "metrics" (its Prometheus endpoint), "headers"
    (the cluster token, which its REST API asks for), "temp_dir" (its logs under session_latest)}.

    Its own temp dir keeps other drivers on this machine from joining it by accident, and
    teardown stops only its processes (found by that dir), never another cluster's.
    """
    import subprocess
    import sys
    import tempfile

    ray = str(Path(sys.executable).parent / "ray")
    token_file = Path.home() / ".ray" / "auth_token"
    # a fresh machine where no token-mode driver ran yet (a test run alone): make the token
    if not token_file.is_file():
        subprocess.run([ray, "get-auth-token", "--generate"], capture_output=True, timeout=120, check=True)
    for _ in range(3):
        temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths live under it
        # Every port its own: the job agent's default (52365) is held by the session's ray_cluster, and an
        # agent that cannot bind it serves no job submission ("No available agent to submit job").
        port, dashboard, metrics, agent = free_port(), free_port(), free_port(), free_port()
        try:
            started = subprocess.run(
                [
                    ray,
                    "start",
                    "--head",
                    f"--port={port}",
                    "--num-cpus=2",
                    f"--temp-dir={temp_dir}",
                    "--disable-usage-stats",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dashboard}",
                    f"--metrics-export-port={metrics}",
                    f"--dashboard-agent-listen-port={agent}",
                    *extra_args,
                ],
                capture_output=True,
                text=True,
                timeout=180,
                env={**os.environ, **(env or {})},
            )
        except BaseException:  # interrupted while it starts (Ctrl-C, the timeout): what started of it goes too
            stop_head(temp_dir)
            raise
        if started.returncode == 0:
            break
        # A port found free was taken before Ray bound it (another process on this busy machine):
        # what started of this head goes, and the next try takes other ports.
        stop_head(temp_dir)
    else:
        raise RuntimeError(
            f"ray start --head failed 3 times; the last said:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}"
        )
    token = token_file.read_text().strip()
    try:
        yield {
            "address": f"127.0.0.1:{port}",
            "dashboard": f"http://127.0.0.1:{dashboard}",
            "temp_dir": temp_dir,
            "metrics": f"http://127.0.0.1:{metrics}/metrics",
            "headers": {"Authorization": f"Bearer {token}"},
        }
    finally:
        stop_head(temp_dir)


@pytest.fixture(scope="module")  # gone before other modules start Serve: its proxy holds port 8000
def ray_head():
    """A head node of 2 CPUs (`head_node`)."""
    with head_node() as head:
        yield head


@pytest.fixture(scope="module")
def ray_head_with_gpus():
    """A head node that declares 2 GPUs: Ray's resources are logical, so placement groups of GPU
    bundles are reserved, scheduled and removed by Ray itself on a machine without a GPU."""
    with head_node("--num-gpus=2") as head:
        yield head


@pytest.fixture(scope="session")
def actor_pids(ray_cluster):
    """pids of the live actors whose class name starts with a prefix, from Ray's actor table: tests
    kill real processes by their own pid, never by name."""
    from ray._private.state import actors

    def pids(class_prefix: str) -> list[int]:
        table = actors(actor_state_name="ALIVE").values()
        return sorted(a["Pid"] for a in table if a["ActorClassName"].startswith(class_prefix))

    return pids


@pytest.fixture(scope="session")
def lora_adapters(tiny_model, tmp_path_factory) -> dict[str, str]:
    """Two LoRA adapters for the tiny model with random (non-zero) weights, saved with save_pretrained."""
    from jobs.sources.tiny_model import random_lora_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {name: str(random_lora_adapter(tiny_model, root / name, seed)) for seed, name in enumerate(["a", "b"])}


@pytest.fixture(scope="session")
def perturbed_base(tiny_model, tmp_path_factory) -> str:
    """Another base model with the tiny model's tokenizer: its weights plus noise, saved with
    save_pretrained. Where a test needs a second base and not the preset's own (`base: other`,
    a second two-minute pretraining build, tested in tests/jobs/sources/test_tiny_model.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("perturbed") / "base"
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    return str(out)
