"""cluster.yaml passes Ray's own cluster-launcher validation (what `ray up` runs before it
contacts the cloud), and matches the pins it promises."""

import copy
import re
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


@pytest.fixture(scope="module")
def ray_aws():
    """Ray 2.60's AWS provider modules (`ray.autoscaler._private.aws`): (config, node_provider). They
    import boto3 and botocore at the top, though the functions used here make no AWS call. boto3 is not
    in the dev extra (botocore caps python-dateutil below 3; the lock pins 4), so where it is missing,
    empty modules stand in for the imports alone, and are taken out again afterwards."""
    import importlib
    import sys
    import types

    before = set(sys.modules)
    try:
        import boto3  # noqa: F401
    except ImportError:
        names = {
            "boto3": {"__version__": "1.44.8"},
            "boto3.exceptions": {"ResourceNotExistsError": type("ResourceNotExistsError", (Exception,), {})},
            "boto3.resources": {},
            "boto3.resources.base": {"ServiceResource": object},
            "botocore": {},
            "botocore.client": {"BaseClient": object},
            "botocore.config": {"Config": object},
            "botocore.exceptions": {"ClientError": type("ClientError", (Exception,), {})},
        }
        for name, attributes in names.items():
            sys.modules[name] = types.ModuleType(name)
            vars(sys.modules[name]).update(attributes)
        sys.modules["botocore"].exceptions = sys.modules["botocore.exceptions"]
    modules = importlib.import_module("ray.autoscaler._private.aws.config"), importlib.import_module("ray.autoscaler._private.aws.node_provider")
    yield modules
    for name in set(sys.modules) - before:
        if name.split(".")[0] in {"boto3", "botocore"} or name.startswith("ray.autoscaler._private.aws"):
            del sys.modules[name]


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
    assert f"docker inspect --format '{{{{index .RepoDigests 0}}}}' {image}" in CLUSTER_YAML.read_text()  # how to fill it in


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


def test_every_node_type_names_one_pinned_image_with_a_new_enough_driver(config):
    """One machine image by its id on every node type (none falls back to the launcher's default, an
    old driver; no SSM alias that moves under a running cluster), and the command that finds the newest
    release of the image whose driver is new enough, beside it."""
    images = {name: node["node_config"].get("ImageId") for name, node in config["available_node_types"].items()}
    assert len(set(images.values())) == 1 and re.fullmatch(r"ami-[0-9a-f]{8,17}", images["head"]), images
    assert "aws ec2 describe-images --region us-west-2 --owners amazon" in CLUSTER_YAML.read_text()
    assert '"Name=name,Values=Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"' in CLUSTER_YAML.read_text()
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
    assert not {a.split(":")[0] for a in actions(head)} - {"ec2", "iam", "elasticfilesystem"}  # no S3, no SSM, no other service
    for statement in head["Statement"]:
        if {"ec2:TerminateInstances", "ec2:StopInstances"} & set(statement["Action"]):
            assert statement["Condition"] == {"StringEquals": {"ec2:ResourceTag/ray-cluster-name": config["cluster_name"]}}
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
    groups = {name: tuple(node["node_config"]["SecurityGroupIds"]) for name, node in config["available_node_types"].items()}
    subnets = {name: tuple(node["node_config"]["SubnetIds"]) for name, node in config["available_node_types"].items()}
    assert len(set(groups.values())) == 1 and len(next(iter(groups.values()))) == 1, groups  # one group for all
    assert len(set(subnets.values())) == 1 and len(next(iter(subnets.values()))) == 1, subnets  # one subnet (the head's policy names it)
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
    assert [rule for group, rule in rules if group == "EFS_SG"] == ["IpProtocol=tcp,FromPort=2049,ToPort=2049,UserIdGroupPairs=[{GroupId=$SG}]"]
    assert not [rule for group, rule in rules if "0.0.0.0/0" in rule or "::/0" in rule]
    assert "aws efs create-mount-target --file-system-id $FS --subnet-id $SUBNET --security-groups $EFS_SG" in doc
    assert "aws efs put-file-system-policy --file-system-id $FS --policy file://docs/aws/efs-policy.json" in doc
    assert "create-security-group --group-name subliminal " in doc


def test_the_shared_store_is_mounted_with_tls(config):
    mounts = [c for c in config["initialization_commands"] if "mount " in c and "mountpoint" in c]
    assert mounts and all("-t efs -o tls" in c for c in mounts) and not any("nfs" in c for c in config["initialization_commands"])
    (helper,) = [c for c in config["initialization_commands"] if "command -v mount.efs" in c]
    import subprocess

    done = subprocess.run(["/bin/bash", "-c", helper], env={"PATH": "/nonexistent"}, capture_output=True, text=True)  # a node without the helper
    assert done.returncode == 1 and "amazon-efs-utils is not installed" in done.stdout  # stops: never mounts in the clear


def test_the_file_system_refuses_clients_without_tls_or_the_clusters_roles(config):
    """Mounting with `tls,iam` is the client's choice; the file system's own policy makes it the only
    way in: deny any request without TLS, allow mounting and writing to the two roles cluster.yaml's
    profiles carry (no statement for an anonymous client, so one without IAM is refused)."""
    import json

    policy = json.loads((POLICIES / "efs-policy.json").read_text())
    (mount,) = [c for c in config["initialization_commands"] if "mount -t efs" in c]
    file_system = re.search(r"(fs-[0-9a-f]+):/", mount).group(1)
    assert {s["Resource"] for s in policy["Statement"]} == {f"arn:aws:elasticfilesystem:{config['provider']['region']}:{ACCOUNT}:file-system/{file_system}"}
    (deny,) = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny["Principal"] == {"AWS": "*"} and deny["Action"] == "*" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    (allow,) = [s for s in policy["Statement"] if s["Effect"] == "Allow"]
    roles = {node["node_config"]["IamInstanceProfile"]["Name"] for node in config["available_node_types"].values()}
    assert sorted(allow["Principal"]["AWS"]) == sorted(f"arn:aws:iam::{ACCOUNT}:role/{role}" for role in roles)  # each profile's role of the same name
    assert set(allow["Action"]) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}  # no root access
    assert allow["Condition"] == {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}


def test_mlflows_embedded_store_is_on_a_local_disk_not_the_shared_file_system(config):
    (uri,) = [o.split("=", 1)[1] for o in config["docker"]["run_options"] if o.startswith("-e MLFLOW_TRACKING_URI=")]
    local = {o.split(":")[1] for o in config["docker"]["run_options"] if o.startswith("-v /opt/dlami/nvme:")}
    assert uri.startswith("sqlite:///") and not uri.removeprefix("sqlite:///").startswith("/mnt/shared")
    assert any(uri.removeprefix("sqlite:///").startswith(folder + "/") for folder in local)  # the node's own NVMe


ACCOUNT = "ACCOUNT_ID"  # the policies' placeholder


def ray_launch(ray_aws, config: dict, node_type: str) -> dict:
    """The RunInstances request Ray's AWS provider sends for one worker of `node_type`: its own
    `_create_node`, EC2 replaced by a recorder, with the tags Ray's node launchers (v1 and v2) give a
    worker and the key pair `ray up`'s bootstrap adds."""
    import types

    from ray.autoscaler import tags

    _, node_provider = ray_aws
    sent = []
    provider = object.__new__(node_provider.AWSNodeProvider)
    provider.cluster_name, provider.provider_config = config["cluster_name"], config["provider"]
    provider.ec2_fail_fast = types.SimpleNamespace(create_instances=lambda **request: sent.append(request) or [])
    worker_tags = {
        tags.TAG_RAY_NODE_NAME: f"ray-{config['cluster_name']}-worker",
        tags.TAG_RAY_NODE_KIND: tags.NODE_KIND_WORKER,
        tags.TAG_RAY_NODE_STATUS: tags.STATUS_UNINITIALIZED,
        tags.TAG_RAY_LAUNCH_CONFIG: "0" * 40,
        tags.TAG_RAY_LAUNCH_REQUEST: "1",
        tags.TAG_RAY_USER_NODE_TYPE: node_type,
    }
    node_config = {**copy.deepcopy(config["available_node_types"][node_type]["node_config"]), "KeyName": "ray-autoscaler_us-west-2"}
    provider._create_node(node_config, worker_tags, 1)
    (request,) = sent
    return request


def as_iam_sees_it(request: dict, region: str) -> dict[str, dict]:
    """Each resource a RunInstances request touches, by ARN, with the condition keys IAM gives it."""
    arn = f"arn:aws:ec2:{region}:{ACCOUNT}"
    tagged = {spec["ResourceType"]: {tag["Key"]: tag["Value"] for tag in spec["Tags"]} for spec in request["TagSpecifications"]}

    def tags(kind: str) -> dict:
        given = tagged.get(kind, {})
        return {"aws:TagKeys": list(given), **{f"aws:RequestTag/{key}": value for key, value in given.items()}} if given else {}

    (disk,) = [mapping["Ebs"] for mapping in request["BlockDeviceMappings"]]
    subnet = f"{arn}:subnet/{request['SubnetId']}"
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile/{request['IamInstanceProfile']['Name']}"
    return {
        f"{arn}:instance/i-0123456789abcdef0": {"ec2:InstanceType": request["InstanceType"], "ec2:InstanceProfile": profile, **tags("instance")},
        subnet: {},
        **{f"{arn}:security-group/{group}": {} for group in request["SecurityGroupIds"]},
        f"arn:aws:ec2:{region}::image/{request['ImageId']}": {},
        f"{arn}:key-pair/{request['KeyName']}": {},
        f"{arn}:volume/vol-0123456789abcdef0": {"ec2:VolumeType": disk["VolumeType"], "ec2:VolumeSize": disk["VolumeSize"], **tags("volume")},
        f"{arn}:network-interface/eni-0123456789abcdef0": {"ec2:Subnet": subnet},
    }


def holds(operator: str, key: str, wanted, context: dict) -> bool:
    """One IAM condition, for the operators the policies use. A key the request lacks fails each of
    them but ForAllValues (true over an empty set), as in IAM."""
    wanted = [wanted] if isinstance(wanted, str) else wanted
    have = context.get(key)
    if operator == "ForAllValues:StringEquals":
        return set(have or []) <= set(wanted)
    if have is None:
        return False
    if operator in ("StringEquals", "ArnEquals"):
        return have in wanted
    if operator == "NumericLessThanEquals":
        return float(have) <= float(wanted[0])
    raise AssertionError(f"condition operator {operator} is not modelled here")


def allowed(policy: dict, action: str, resource: str, context: dict) -> bool:
    """IAM's answer for one action on one resource under an Allow-only policy: some statement names the
    action, matches the resource (ARN wildcards) and has every condition hold."""
    import fnmatch

    for statement in policy["Statement"]:
        resources = [statement["Resource"]] if isinstance(statement["Resource"], str) else statement["Resource"]
        if action in statement["Action"] and any(fnmatch.fnmatchcase(resource, pattern) for pattern in resources):
            if all(holds(op, key, wanted, context) for op, keys in statement.get("Condition", {}).items() for key, wanted in keys.items()):
                return True
    return False


def refused(policy: dict, request: dict, region: str) -> list[str]:
    """The resources of a launch the policy does not allow, RunInstances and tagging at launch both."""
    out = []
    for resource, context in as_iam_sees_it(request, region).items():
        launch_tags = {**context, "ec2:CreateAction": "RunInstances"}
        if not allowed(policy, "ec2:RunInstances", resource, context) or (
            "aws:TagKeys" in context and not allowed(policy, "ec2:CreateTags", resource, launch_tags)
        ):
            out.append(resource)
    return out


@pytest.fixture(scope="module")
def head_policy():
    import json

    return json.loads((POLICIES / "head-policy.json").read_text())


WORKERS = ["gpu-8x-h100", "gpu-1x-l40s"]


@pytest.mark.parametrize("node_type", WORKERS)
def test_the_head_may_launch_what_ray_launches_for_this_cluster(config, ray_aws, head_policy, node_type):
    assert refused(head_policy, ray_launch(ray_aws, config, node_type), config["provider"]["region"]) == []


DISK_TAGS = {"ResourceType": "volume", "Tags": [{"Key": "ray-cluster-name", "Value": "subliminal"}]}
ELSEWHERE = {  # a launch the head's role must refuse: what changes in the worker's node_config, and the resources refused
    "another instance type": ({"InstanceType": "p4d.24xlarge"}, "instance/"),
    "another subnet": ({"SubnetIds": ["subnet-0fffffffffffffff0"]}, "subnet/ network-interface/"),
    "another group": ({"SecurityGroupIds": ["sg-0fffffffffffffff0"]}, "security-group/"),
    "another image": ({"ImageId": "ami-0fffffffffffffff0"}, "image/"),
    "another instance profile": ({"IamInstanceProfile": {"Name": "admin"}}, "instance/"),
    "a tag of its own": ({"TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "owner", "Value": "x"}]}, DISK_TAGS]}, "instance/"),
    "an untagged disk": ({"TagSpecifications": []}, "volume/"),
    "a larger disk": ({"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 16000, "VolumeType": "gp3"}}]}, "volume/"),
}


@pytest.mark.parametrize("change", list(ELSEWHERE))
def test_the_head_may_not_launch_anything_else(config, ray_aws, head_policy, change):
    changed, resource = ELSEWHERE[change]
    config = copy.deepcopy(config)
    config["available_node_types"]["gpu-1x-l40s"]["node_config"].update(copy.deepcopy(changed))
    denied = refused(head_policy, ray_launch(ray_aws, config, "gpu-1x-l40s"), config["provider"]["region"])
    assert " ".join(arn.split(":")[-1].split("/")[0] + "/" for arn in denied) == resource


def test_each_launch_statement_names_cluster_yamls_values(config, ray_aws, head_policy):
    """No RunInstances on `*`: each resource type has its statement, bound to exactly what cluster.yaml
    and Ray's provider use (the worker types, the subnet, the group, the image, Ray's tag keys)."""
    launches = [s for s in head_policy["Statement"] if "ec2:RunInstances" in s["Action"]]
    assert all(s["Action"] == ["ec2:RunInstances"] and "*" not in s["Resource"].split(":")[3:5] for s in launches)
    by_type = {s["Resource"].split(":")[-1].split("/")[0]: s for s in launches}
    assert set(by_type) == {"instance", "subnet", "security-group", "image", "key-pair", "volume", "network-interface"}
    nodes = config["available_node_types"]
    worker = nodes["gpu-1x-l40s"]["node_config"]
    instance = by_type["instance"]["Condition"]
    assert sorted(instance["StringEquals"]["ec2:InstanceType"]) == sorted(nodes[name]["node_config"]["InstanceType"] for name in WORKERS)
    assert instance["StringEquals"]["aws:RequestTag/ray-cluster-name"] == config["cluster_name"]
    assert by_type["subnet"]["Resource"].endswith(f":subnet/{worker['SubnetIds'][0]}")
    assert by_type["security-group"]["Resource"].endswith(f":security-group/{worker['SecurityGroupIds'][0]}")
    assert by_type["image"]["Resource"].endswith(f"::image/{worker['ImageId']}")
    assert by_type["network-interface"]["Condition"] == {"ArnEquals": {"ec2:Subnet": by_type["subnet"]["Resource"]}}
    sent = {tag["Key"] for spec in ray_launch(ray_aws, config, "gpu-8x-h100")["TagSpecifications"] for tag in spec["Tags"]}
    for statement in [by_type["instance"], by_type["volume"]] + [
        s for s in head_policy["Statement"] if s.get("Condition", {}).get("StringEquals", {}).get("ec2:CreateAction")
    ]:
        assert set(statement["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]) == sent  # Ray's keys, no more
    disks = [m["Ebs"] for node in nodes.values() for m in node["node_config"]["BlockDeviceMappings"]]
    assert float(by_type["volume"]["Condition"]["NumericLessThanEquals"]["ec2:VolumeSize"]) == max(d["VolumeSize"] for d in disks)


def simulation_context(ray_aws, config: dict) -> list[dict]:
    """`aws iam simulate-custom-policy --context-entries` for Ray's launch of an 8 x H100 worker: every
    resource's condition keys in one list (the simulator gives each resource the same context)."""
    resources = as_iam_sees_it(ray_launch(ray_aws, config, "gpu-8x-h100"), config["provider"]["region"])
    merged = {}
    for context in resources.values():
        for key, value in context.items():  # lists (the tag keys) joined: the instance's and the disk's
            merged[key] = list(dict.fromkeys(merged.get(key, []) + value)) if isinstance(value, list) else value
    kind = {list: "stringList", int: "numeric", str: "string"}
    return [
        {"ContextKeyName": key, "ContextKeyValues": [str(v) for v in (value if isinstance(value, list) else [value])], "ContextKeyType": kind[type(value)]}
        for key, value in sorted(merged.items())
    ]


def test_the_documented_simulation_is_rays_launch(config, ray_aws, head_policy):
    """docs/operations.md's `iam simulate-custom-policy` command asks AWS about the launch tested above:
    its context file holds the condition keys of Ray's own request, its resources that request's."""
    import json

    assert json.loads((POLICIES / "simulate-launch.json").read_text()) == simulation_context(ray_aws, config)
    doc = (CLUSTER_YAML.parent / "docs" / "operations.md").read_text()
    command = doc[doc.index("aws iam simulate-custom-policy") :].split("\n\n")[0]
    assert "--policy-input-list file://docs/aws/head-policy.json" in command and "--context-entries file://docs/aws/simulate-launch.json" in command
    expected = {arn for arn in as_iam_sees_it(ray_launch(ray_aws, config, "gpu-8x-h100"), config["provider"]["region"]) if ":key-pair/" not in arn}
    assert set(re.findall(r"arn:aws:ec2:[^\s\\]+", command)) == expected
