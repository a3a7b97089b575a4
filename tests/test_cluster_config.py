"""cluster.yaml passes Ray's own cluster-launcher validation (what `ray up` runs before it
contacts the cloud), and matches the pins it promises."""

import copy
import re
from pathlib import Path

import pytest
import ray
import yaml
from aws_provider import provider_modules  # tests/ is on the path, as for conftest
from ray.autoscaler._private.util import prepare_config, validate_config

from train.cluster import launcher_node_gpus

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load(CLUSTER_YAML.read_text())


ray_aws = pytest.fixture(scope="module")(provider_modules)  # Ray's AWS provider modules (tests/aws_provider.py)


def test_cluster_yaml_passes_ray_validation(config):
    validate_config(prepare_config(copy.deepcopy(config)))


def test_validation_would_catch_a_broken_config(config):
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu-8x-h100"]["max_wrokers"] = 2
    with pytest.raises(Exception, match="max_wrokers"):
        validate_config(prepare_config(broken))


def test_image_matches_the_pinned_ray_and_python_and_is_pinned_by_digest(config):
    image, digest = config["docker"]["image"].split("@")
    assert image == f"rayproject/ray:{ray.__version__}-py311-gpu" and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    # how to fill it in
    assert f"docker inspect --format '{{{{index .RepoDigests 0}}}}' {image}" in CLUSTER_YAML.read_text()


def test_gpu_nodes_install_the_hashed_lock_then_the_project_alone(config):
    """pip checks hashes only for what comes from `-r` under --require-hashes (it ignores them in a
    `-c` file) and refuses a directory install there: the lock first, then the project without deps."""
    installs = [c for c in config["setup_commands"] if c.startswith("pip install")]
    assert installs == [
        'pip install --no-cache-dir --require-hashes -r "$HOME/subliminal-ray/constraints/gpu-lock.txt"',
        'pip install --no-cache-dir --no-deps "$HOME/subliminal-ray"',
    ]


def test_every_node_starts_ray_with_the_proxy_body_guard(config):
    """Serve may run a proxy on any node; each must cut a chunked body at the limit (serve/proxy_guard.py)."""
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (start,) = [c for c in config[key] if "ray start" in c]
        assert start.startswith("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.proxy_guard.middlewares ray start"), (
            start
        )


def test_every_node_starts_ray_locked_and_the_dashboard_on_loopback(config):
    """Token auth on every node (the containers run with RAY_AUTH_MODE=token, so a node without the
    token file refuses to start), and the head's dashboard only on loopback: reached through
    `ray dashboard cluster.yaml`'s SSH tunnel, never open on the node's address."""
    assert "-e RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # copied with the default umask: made the owner's alone first
    assert config["setup_commands"][0] == "chmod 600 ~/.ray/auth_token"
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head


def test_gpu_bounds(config):
    # Two 8 x H100 nodes and two 1 x L40S nodes at most: what jobs/sizing/placement.py checks presets against.
    assert launcher_node_gpus(config) == (8.0, 8.0, 1.0, 1.0)
    assert config["idle_timeout_minutes"] > 0


def test_every_node_type_names_one_pinned_image_with_a_new_enough_driver(config):
    """One machine image by its id on every node type (none falls back to the launcher's default, an
    old driver; no SSM alias that moves under a running cluster), and the command that finds the newest
    release of the image whose driver is new enough, beside it."""
    images = {name: node["node_config"].get("ImageId") for name, node in config["available_node_types"].items()}
    assert len(set(images.values())) == 1 and re.fullmatch(r"ami-[0-9a-f]{8,17}", images["head"]), images
    assert "aws ec2 describe-images --region us-west-2 --owners amazon" in CLUSTER_YAML.read_text()
    assert (
        '"Name=name,Values=Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"' in CLUSTER_YAML.read_text()
    )
    # where that image mounts NVMe
    assert any("/opt/dlami/nvme:" in option for option in config["docker"]["run_options"])


@pytest.mark.parametrize(
    "driver, fails", [("470.57.02", True), ("575.51.03", True), ("580.95.05", False), ("595.91.07", False)]
)
def test_gpu_nodes_stop_at_setup_on_an_old_driver(config, tmp_path, driver, fails):
    import os
    import subprocess

    fake = tmp_path / "nvidia-smi"  # answers the driver query as the real one does
    fake.write_text(f"#!/bin/sh\necho {driver}\n")
    fake.chmod(0o755)
    (check,) = [c for c in config["worker_setup_commands"] if "nvidia-smi" in c]
    done = subprocess.run(
        ["bash", "-c", check],
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
    )
    assert (done.returncode != 0) == fails and (f"NVIDIA driver {driver} is older than 580" in done.stdout) == fails
    assert any("torch.cuda.device_count()" in c and "sys.exit" in c for c in config["worker_setup_commands"])


POLICIES = CLUSTER_YAML.parent / "docs" / "aws"
ACCOUNT = "ACCOUNT_ID"  # the policies' placeholder


def actions(policy: dict) -> list[str]:
    return [
        a
        for statement in policy["Statement"]
        for a in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    ]


def test_each_node_type_has_an_instance_profile_of_least_privilege(config):
    """Named profiles, so Ray does not give the head its default role (every EC2 and S3 action): the head's
    may launch and tag, and stop or terminate only this cluster's instances, pass only the workers' role
    and mount the file system; the workers' may only mount it."""
    import json

    profiles = {
        name: node["node_config"].get("IamInstanceProfile", {}).get("Name")
        for name, node in config["available_node_types"].items()
    }
    assert profiles == {
        "head": "subliminal-head",
        "gpu-8x-h100": "subliminal-worker",
        "gpu-1x-l40s": "subliminal-worker",
    }
    head, worker = (json.loads((POLICIES / f"{who}-policy.json").read_text()) for who in ("head", "worker"))
    for policy in (head, worker):
        assert all(statement["Effect"] == "Allow" for statement in policy["Statement"])
        assert not [a for a in actions(policy) if "*" in a], actions(policy)  # no wildcard action
    assert set(actions(worker)) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}
    # no S3, no SSM, no other service
    assert not {a.split(":")[0] for a in actions(head)} - {"ec2", "iam", "elasticfilesystem"}
    for statement in head["Statement"]:
        if {"ec2:TerminateInstances", "ec2:StopInstances"} & set(statement["Action"]):
            assert statement["Condition"] == {
                "StringEquals": {"ec2:ResourceTag/ray-cluster-name": config["cluster_name"]}
            }
        if "iam:PassRole" in statement["Action"]:
            assert statement["Action"] == ["iam:PassRole"] and statement["Resource"].endswith(":role/subliminal-worker")


def test_ray_opens_ssh_to_the_world_in_any_group_it_makes(ray_aws):
    """Why cluster.yaml names its own group: the rules Ray 2.60's provider puts on a group it creates,
    from its own function, hold a port-22 rule open to 0.0.0.0/0 even beside the one range asked for."""
    aws_config, _ = ray_aws

    asked = [{"FromPort": 22, "ToPort": 22, "IpProtocol": "tcp", "IpRanges": [{"CidrIp": "203.0.113.0/24"}]}]
    rules = aws_config._create_default_inbound_rules({"sg-0123456789abcdef0"}, asked)
    assert asked[0] in rules
    assert any(r["FromPort"] == 22 and {"CidrIp": "0.0.0.0/0"} in r.get("IpRanges", []) for r in rules)


class MadeAGroup(Exception):
    pass


def test_every_node_type_names_the_group_so_ray_makes_none(config, ray_aws, monkeypatch):
    """Ray's `_configure_security_group` (run by `ray up`) returns before it creates or edits a group
    only when every node type names one; cluster.yaml does, so the rules above are never applied."""
    aws_config, _ = ray_aws

    def made(*args, **kwargs):
        raise MadeAGroup(args[1])

    monkeypatch.setattr(aws_config, "_upsert_security_groups", made)
    assert "security_group" not in config["provider"]  # nothing for Ray to merge its rules with
    aws_config._configure_security_group(copy.deepcopy(config))  # returns early: no AWS call
    groups = {
        name: tuple(node["node_config"]["SecurityGroupIds"]) for name, node in config["available_node_types"].items()
    }
    subnets = {name: tuple(node["node_config"]["SubnetIds"]) for name, node in config["available_node_types"].items()}
    assert len(set(groups.values())) == 1 and len(next(iter(groups.values()))) == 1, groups  # one group for all
    # one subnet (the head's policy names it)
    assert len(set(subnets.values())) == 1 and len(next(iter(subnets.values()))) == 1, subnets
    unnamed = copy.deepcopy(config)
    del unnamed["available_node_types"]["gpu-1x-l40s"]["node_config"]["SecurityGroupIds"]
    with pytest.raises(MadeAGroup, match="gpu-1x-l40s"):  # one node type without it, and Ray makes a group
        aws_config._configure_security_group(unnamed)


def test_the_documented_groups_open_ssh_to_one_range_and_the_rest_to_the_cluster():
    """docs/operations.md's commands make the group cluster.yaml names (port 22 from one range, every
    port from the group's own members) and the file system's mount target group (NFS from the
    cluster's group), nothing open to the world, and give the file system its policy."""
    doc = (CLUSTER_YAML.parent / "docs" / "operations.md").read_text()
    rules = re.findall(r'authorize-security-group-ingress --group-id \$(\w+) \\\n\s*--ip-permissions "([^"]+)"', doc)
    assert len(rules) == doc.count("authorize-security-group-ingress")  # every rule the docs add is read here
    assert sorted(rule for group, rule in rules if group == "SG") == [
        "IpProtocol=-1,UserIdGroupPairs=[{GroupId=$SG}]",
        "IpProtocol=tcp,FromPort=22,ToPort=22,IpRanges=[{CidrIp=203.0.113.0/24}]",
    ]
    assert [rule for group, rule in rules if group == "EFS_SG"] == [
        "IpProtocol=tcp,FromPort=2049,ToPort=2049,UserIdGroupPairs=[{GroupId=$SG}]"
    ]
    assert not [rule for group, rule in rules if "0.0.0.0/0" in rule or "::/0" in rule]
    assert "aws efs create-mount-target --file-system-id $FS --subnet-id $SUBNET --security-groups $EFS_SG" in doc
    assert "aws efs put-file-system-policy --file-system-id $FS --policy file://docs/aws/efs-policy.json" in doc
    assert "create-security-group --group-name subliminal " in doc


def test_the_shared_store_is_mounted_with_tls(config):
    mounts = [c for c in config["initialization_commands"] if "mount " in c and "mountpoint" in c]
    assert (
        mounts
        and all("-t efs -o tls" in c for c in mounts)
        and not any("nfs" in c for c in config["initialization_commands"])
    )
    (helper,) = [c for c in config["initialization_commands"] if "command -v mount.efs" in c]
    import subprocess

    # a node without the helper
    done = subprocess.run(["/bin/bash", "-c", helper], env={"PATH": "/nonexistent"}, capture_output=True, text=True)
    # stops: never mounts in the clear
    assert done.returncode == 1 and "amazon-efs-utils is not installed" in done.stdout


def test_the_file_system_refuses_clients_without_tls_or_the_clusters_roles(config):
    """Mounting with `tls,iam` is the client's choice; the file system's own policy makes it the only
    way in: deny any request without TLS, allow mounting and writing to the two roles cluster.yaml's
    profiles carry (no statement for an anonymous client, so one without IAM is refused)."""
    import json

    policy = json.loads((POLICIES / "efs-policy.json").read_text())
    (mount,) = [c for c in config["initialization_commands"] if "mount -t efs" in c]
    file_system = re.search(r"(fs-[0-9a-f]+):/", mount).group(1)
    assert {s["Resource"] for s in policy["Statement"]} == {
        f"arn:aws:elasticfilesystem:{config['provider']['region']}:{ACCOUNT}:file-system/{file_system}"
    }
    (deny,) = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert (
        deny["Principal"] == {"AWS": "*"}
        and deny["Action"] == "*"
        and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    )
    (allow,) = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    roles = {node["node_config"]["IamInstanceProfile"]["Name"] for node in config["available_node_types"].values()}
    # each profile's role of the same name
    assert sorted(allow["Principal"]["AWS"]) == sorted(f"arn:aws:iam::{ACCOUNT}:role/{role}" for role in roles)
    assert set(allow["Action"]) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}  # no root access
    assert allow["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}


def test_mlflows_embedded_store_is_on_a_local_disk_not_the_shared_file_system(config):
    (uri,) = [o.split("=", 1)[1] for o in config["docker"]["run_options"] if o.startswith("-e MLFLOW_TRACKING_URI=")]
    local = {o.split(":")[1] for o in config["docker"]["run_options"] if o.startswith("-v /opt/dlami/nvme:")}
    assert uri.startswith("sqlite:///") and not uri.removeprefix("sqlite:///").startswith("/mnt/shared")
    assert any(uri.removeprefix("sqlite:///").startswith(folder + "/") for folder in local)  # the node's own NVMe


def test_the_local_autoscaling_stand_in_is_made_from_this_file(config):
    """bench/autoscale.py's fake_multinode config takes cluster.yaml's node-type section (one source):
    the same worker types and bounds, each a CPU stand-in of one CPU per GPU; Ray's validation passes it,
    and the capacity reading sees what the autoscaler can add."""
    import sys

    sys.path.insert(0, str(CLUSTER_YAML.parent / "bench"))
    from autoscale import HEAD_TYPE, stand_in_config

    from train.cluster import launcher_nodes

    stand_in = stand_in_config(config, "10.0.0.5:41234", 0.5)
    # as the autoscaler itself checks a config it reads (no prepare: its defaults file is not in the wheel)
    validate_config(stand_in)
    workers = {name: node for name, node in config["available_node_types"].items() if name != config["head_node_type"]}
    assert set(stand_in["available_node_types"]) == {HEAD_TYPE, *workers}
    for name, node in workers.items():
        mirrored = stand_in["available_node_types"][name]
        assert (mirrored["min_workers"], mirrored["max_workers"]) == (node["min_workers"], node["max_workers"])
        assert mirrored["resources"]["CPU"] == node["resources"]["GPU"]
    assert stand_in["max_workers"] == config["max_workers"] and stand_in["provider"]["gcs_address"] == "10.0.0.5:41234"
    assert sorted(launcher_nodes(stand_in, "CPU")) == sorted([0.0, *launcher_node_gpus(config)])
