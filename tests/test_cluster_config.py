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
    assert config["setup_commands"][0] == "chmod 600 ~/.ray/auth_token"  # copied with the default umask: made the owner's alone first
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


POLICIES = CLUSTER_YAML.parent / "docs" / "aws"


def actions(policy: dict) -> list[str]:
    return [a for statement in policy["Statement"] for a in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])]


def test_each_node_type_has_an_instance_profile_of_least_privilege(config):
    """Named profiles, so Ray does not give the head its default role (every EC2 and S3 action): the head's
    may launch and tag, and stop or terminate only this cluster's instances, pass only the workers' role
    and mount the file system; the workers' may only mount it."""
    import json

    profiles = {name: node["node_config"].get("IamInstanceProfile", {}).get("Name") for name, node in config["available_node_types"].items()}
    assert profiles == {"head": "subliminal-head", "gpu-8x-h100": "subliminal-worker", "gpu-1x-l40s": "subliminal-worker"}
    head, worker = (json.loads((POLICIES / f"{who}-policy.json").read_text()) for who in ("head", "worker"))
    for policy in (head, worker):
        assert all(statement["Effect"] == "Allow" for statement in policy["Statement"])
        assert not [a for a in actions(policy) if "*" in a], actions(policy)  # no wildcard action
    assert set(actions(worker)) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}
    assert not {a.split(":")[0] for a in actions(head)} - {"ec2", "ssm", "iam", "elasticfilesystem"}  # no S3, no other service
    for statement in head["Statement"]:
        if {"ec2:TerminateInstances", "ec2:StopInstances"} & set(statement["Action"]):
            assert statement["Condition"] == {"StringEquals": {"ec2:ResourceTag/ray-cluster-name": config["cluster_name"]}}
        if "iam:PassRole" in statement["Action"]:
            assert statement["Action"] == ["iam:PassRole"] and statement["Resource"].endswith(":role/subliminal-worker")


def test_ssh_is_open_to_one_range_and_the_shared_store_mounted_with_tls(config):
    rules = config["provider"]["security_group"]["IpPermissions"]
    assert [(r["FromPort"], r["ToPort"]) for r in rules] == [(22, 22)]
    ranges = [block["CidrIp"] for r in rules for block in r.get("IpRanges", [])]
    assert ranges and not {"0.0.0.0/0", "::/0"} & set(ranges) and not any(r.get("Ipv6Ranges") for r in rules)
    mounts = [c for c in config["initialization_commands"] if "mount " in c and "mountpoint" in c]
    assert mounts and all("-t efs -o tls" in c for c in mounts) and not any("nfs" in c for c in config["initialization_commands"])
    (helper,) = [c for c in config["initialization_commands"] if "command -v mount.efs" in c]
    import subprocess

    done = subprocess.run(["/bin/bash", "-c", helper], env={"PATH": "/nonexistent"}, capture_output=True, text=True)  # a node without the helper
    assert done.returncode == 1 and "amazon-efs-utils is not installed" in done.stdout  # stops: never mounts in the clear


def test_mlflows_embedded_store_is_on_a_local_disk_not_the_shared_file_system(config):
    (uri,) = [o.split("=", 1)[1] for o in config["docker"]["run_options"] if o.startswith("-e MLFLOW_TRACKING_URI=")]
    local = {o.split(":")[1] for o in config["docker"]["run_options"] if o.startswith("-v /opt/dlami/nvme:")}
    assert uri.startswith("sqlite:///") and not uri.removeprefix("sqlite:///").startswith("/mnt/shared")
    assert any(uri.removeprefix("sqlite:///").startswith(folder + "/") for folder in local)  # the node's own NVMe
