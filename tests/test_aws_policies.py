"""docs/aws/head-policy.json against what Ray's AWS provider really sends: its own launch request
for each worker type (EC2 replaced by a recorder) is allowed, launches outside the cluster are
refused, each statement is bound to cluster.yaml's values, and the documented `aws iam
simulate-custom-policy` command asks AWS about that same request. The evaluator below models the
condition operators the policy uses; it is not AWS's."""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from aws_provider import provider_modules  # tests/ is on the path, as for conftest

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"
POLICIES = CLUSTER_YAML.parent / "docs" / "aws"
ray_aws = pytest.fixture(scope="module")(provider_modules)


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load(CLUSTER_YAML.read_text())


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
    node_config = {
        **copy.deepcopy(config["available_node_types"][node_type]["node_config"]),
        "KeyName": "ray-autoscaler_us-west-2",
    }
    provider._create_node(node_config, worker_tags, 1)
    (request,) = sent
    return request


def as_iam_sees_it(request: dict, region: str) -> dict[str, dict]:
    """Each resource a RunInstances request touches, by ARN, with the condition keys IAM gives it."""
    arn = f"arn:aws:ec2:{region}:{ACCOUNT}"
    tagged = {
        spec["ResourceType"]: {tag["Key"]: tag["Value"] for tag in spec["Tags"]}
        for spec in request["TagSpecifications"]
    }

    def tags(kind: str) -> dict:
        given = tagged.get(kind, {})
        return (
            {"aws:TagKeys": list(given), **{f"aws:RequestTag/{key}": value for key, value in given.items()}}
            if given
            else {}
        )

    (disk,) = [mapping["Ebs"] for mapping in request["BlockDeviceMappings"]]
    subnet = f"{arn}:subnet/{request['SubnetId']}"
    profile = f"arn:aws:iam::{ACCOUNT}:instance-profile/{request['IamInstanceProfile']['Name']}"
    return {
        f"{arn}:instance/i-0123456789abcdef0": {
            "ec2:InstanceType": request["InstanceType"],
            "ec2:InstanceProfile": profile,
            **tags("instance"),
        },
        subnet: {},
        **{f"{arn}:security-group/{group}": {} for group in request["SecurityGroupIds"]},
        f"arn:aws:ec2:{region}::image/{request['ImageId']}": {},
        f"{arn}:key-pair/{request['KeyName']}": {},
        f"{arn}:volume/vol-0123456789abcdef0": {
            "ec2:VolumeType": disk["VolumeType"],
            "ec2:VolumeSize": disk["VolumeSize"],
            **tags("volume"),
        },
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
            if all(
                holds(op, key, wanted, context)
                for op, keys in statement.get("Condition", {}).items()
                for key, wanted in keys.items()
            ):
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
    "a tag of its own": (
        {"TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "owner", "Value": "x"}]}, DISK_TAGS]},
        "instance/",
    ),
    "an untagged disk": ({"TagSpecifications": []}, "volume/"),
    "a larger disk": (
        {"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 16000, "VolumeType": "gp3"}}]},
        "volume/",
    ),
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
    assert set(by_type) == {
        "instance",
        "subnet",
        "security-group",
        "image",
        "key-pair",
        "volume",
        "network-interface",
        "snapshot",
    }
    # the public image's root disk only
    assert by_type["snapshot"]["Condition"] == {"StringEquals": {"ec2:Owner": "amazon"}}
    nodes = config["available_node_types"]
    worker = nodes["gpu-1x-l40s"]["node_config"]
    instance = by_type["instance"]["Condition"]
    assert sorted(instance["StringEquals"]["ec2:InstanceType"]) == sorted(
        nodes[name]["node_config"]["InstanceType"] for name in WORKERS
    )
    assert instance["StringEquals"]["aws:RequestTag/ray-cluster-name"] == config["cluster_name"]
    assert by_type["subnet"]["Resource"].endswith(f":subnet/{worker['SubnetIds'][0]}")
    assert by_type["security-group"]["Resource"].endswith(f":security-group/{worker['SecurityGroupIds'][0]}")
    assert by_type["image"]["Resource"].endswith(f"::image/{worker['ImageId']}")
    assert by_type["network-interface"]["Condition"] == {"ArnEquals": {"ec2:Subnet": by_type["subnet"]["Resource"]}}
    sent = {
        tag["Key"] for spec in ray_launch(ray_aws, config, "gpu-8x-h100")["TagSpecifications"] for tag in spec["Tags"]
    }
    for statement in [by_type["instance"], by_type["volume"]] + [
        s for s in head_policy["Statement"] if s.get("Condition", {}).get("StringEquals", {}).get("ec2:CreateAction")
    ]:
        assert set(statement["Condition"]["ForAllValues:StringEquals"]["aws:TagKeys"]) == sent  # Ray's keys, no more
    disks = [m["Ebs"] for node in nodes.values() for m in node["node_config"]["BlockDeviceMappings"]]
    assert float(by_type["volume"]["Condition"]["NumericLessThanEquals"]["ec2:VolumeSize"]) == max(
        d["VolumeSize"] for d in disks
    )


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
        {
            "ContextKeyName": key,
            "ContextKeyValues": [str(v) for v in (value if isinstance(value, list) else [value])],
            "ContextKeyType": kind[type(value)],
        }
        for key, value in sorted(merged.items())
    ]


def test_the_documented_simulation_is_rays_launch(config, ray_aws, head_policy):
    """docs/operations.md's `iam simulate-custom-policy` command asks AWS about the launch tested above:
    its context file holds the condition keys of Ray's own request, its resources that request's."""
    assert json.loads((POLICIES / "simulate-launch.json").read_text()) == simulation_context(ray_aws, config)
    doc = (CLUSTER_YAML.parent / "docs" / "operations.md").read_text()
    command = doc[doc.index("aws iam simulate-custom-policy") :].split("\n\n")[0]
    assert (
        "--policy-input-list file://docs/aws/head-policy.json" in command
        and "--context-entries file://docs/aws/simulate-launch.json" in command
    )
    expected = {
        arn
        for arn in as_iam_sees_it(ray_launch(ray_aws, config, "gpu-8x-h100"), config["provider"]["region"])
        if ":key-pair/" not in arn
    }
    assert set(re.findall(r"arn:aws:ec2:[^\s\\]+", command)) == expected
