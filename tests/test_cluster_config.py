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


def test_gpu_bounds(config):
    # Two 8 x H100 nodes and two 1 x L40S nodes at most: what jobs/placement.py checks presets against.
    assert launcher_node_gpus(config) == (8.0, 8.0, 1.0, 1.0)
    assert config["idle_timeout_minutes"] > 0
