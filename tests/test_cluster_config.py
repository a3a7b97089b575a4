"""cluster.yaml passes Ray's own cluster-launcher validation (what `ray up` runs before it
contacts the cloud), and matches the pins it promises."""

import copy
from pathlib import Path

import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from train.cluster import launcher_node_gpus

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load(CLUSTER_YAML.read_text())


def test_cluster_yaml_passes_ray_validation(config):
    validate_config(prepare_config(copy.deepcopy(config)))


def test_validation_would_catch_a_broken_config(config):
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu-8x-h100"]["max_wrokers"] = 2
    with pytest.raises(Exception, match="max_wrokers"):
        validate_config(prepare_config(broken))


def test_image_matches_the_pinned_ray_and_python(config):
    assert config["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"
    assert any("[gpu]" in command for command in config["setup_commands"])


def test_every_node_starts_ray_with_the_proxy_body_guard(config):
    """Serve may run a proxy on any node; each must cut a chunked body at the limit (serve/proxy_guard.py)."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (start,) = [c for c in config[key] if "ray start" in c]
        assert start.startswith("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.proxy_guard.middlewares ray start"), start


def test_every_node_starts_ray_locked_and_the_dashboard_on_loopback(config):
    """Token auth on every node (the containers run with RAY_AUTH_MODE=token, so a node without the
    token file refuses to start), and the head's dashboard only on loopback: reached through
    `ray dashboard cluster.yaml`'s SSH tunnel, never open on the node's address."""
    assert "-e RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head


def test_gpu_bounds(config):
    # Two 8 x H100 nodes and two 1 x L40S nodes at most: what jobs/sizing/placement.py checks presets against.
    assert launcher_node_gpus(config) == (8.0, 8.0, 1.0, 1.0)
    assert config["idle_timeout_minutes"] > 0


def test_every_node_type_names_its_image_with_a_new_enough_driver(config):
    images = {name: node["node_config"].get("ImageId") for name, node in config["available_node_types"].items()}
    assert all(images.values()), images  # none falls back to the launcher's default image (an old driver)
    assert {image.split("/")[-3] for image in images.values()} == {"base-oss-nvidia-driver-gpu-ubuntu-22.04"}
    assert any("/opt/dlami/nvme:" in option for option in config["docker"]["run_options"])  # where that image mounts NVMe


@pytest.mark.parametrize("driver, fails", [("470.57.02", True), ("575.51.03", True), ("580.95.05", False), ("595.91.07", False)])
def test_gpu_nodes_stop_at_setup_on_an_old_driver(config, tmp_path, driver, fails):
    import os
    import subprocess

    fake = tmp_path / "nvidia-smi"  # answers the driver query as the real one does
    fake.write_text(f"#!/bin/sh\necho {driver}\n")
    fake.chmod(0o755)
    (check,) = [c for c in config["worker_setup_commands"] if "nvidia-smi" in c]
    done = subprocess.run(["bash", "-c", check], env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, capture_output=True, text=True)
    assert (done.returncode != 0) == fails and (f"NVIDIA driver {driver} is older than 580" in done.stdout) == fails
    assert any("torch.cuda.device_count()" in c and "sys.exit" in c for c in config["worker_setup_commands"])
