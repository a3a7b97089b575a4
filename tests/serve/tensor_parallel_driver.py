"""Driver for tests/serve/test_replica_placement.py: a tensor-parallel replica's placement group on a real cluster.

    python tests/serve/tensor_parallel_driver.py RAY_ADDRESS MODEL_PATH HTTP_PORT

Runs against a head node that declares 2 GPUs (`ray start --head --num-gpus=2`); Ray's resources are
logical, so its placement groups, scheduling and teardown are Ray's own on a machine without a GPU.
It deploys the real service with tensor_parallel_size=2 through `serve.launch.start_service` (the
pipeline's way in), starts a worker in the group's second bundle as vLLM's Ray executor does, then
SIGKILLs the replica and finally deletes the application, and prints what it saw as one JSON line.
A driver of its own because the test process is already attached to the session's cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import ray
import requests
from ray._private.state import actors
from ray.util.placement_group import PlacementGroup, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from serve.launch import start_service, stop_service
from serve.replica_placement import tensor_parallel_group
from serve.settings import ServiceSettings

APP = "tp"


def created_groups() -> dict[str, dict]:
    return {gid: g for gid, g in placement_group_table().items() if g["state"] == "CREATED"}


def replica_pids() -> list[int]:
    return [
        a["Pid"]
        for a in actors(actor_state_name="ALIVE").values()
        if a["ActorClassName"].startswith(f"ServeReplica:{APP}:")
    ]


def status(url: str) -> int:
    try:
        return requests.get(url, timeout=10).status_code
    except requests.RequestException:
        return 0


def wait_for(what: str, check, timeout: float = 120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(what)


@ray.remote(num_cpus=0, num_gpus=1)
class RankWorker:
    """Holds a GPU bundle as vLLM's Ray executor's workers do (num_cpus=0, num_gpus=1, one per bundle)."""

    def gpu_ids(self) -> list:
        return ray.get_gpu_ids()


def in_group(group: PlacementGroup, bundle: int | None = None) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=-1 if bundle is None else bundle)


def main(address: str, model: str, port: int) -> dict:
    ray.init(address=address, log_to_driver=False)
    seen: dict = {"gpus": ray.cluster_resources().get("GPU", 0)}
    settings = ServiceSettings(model=model, engine="hf", tensor_parallel_size=2)
    start_service(settings, name=APP, route_prefix=f"/{APP}", num_cpus=1, num_gpus=2, port=port)
    url = f"http://127.0.0.1:{port}/{APP}/health"
    seen["health"] = requests.get(url, timeout=30).status_code

    (gid, group_info), *others = created_groups().items()
    seen["groups_while_serving"] = 1 + len(others)
    seen["bundles"] = [group_info["bundles"][i] for i in sorted(group_info["bundles"])]
    seen["strategy"] = group_info["strategy"]
    seen["nodes"] = len(set(group_info["bundles_to_node_id"].values()))
    seen["gpus_free_while_serving"] = ray.available_resources().get("GPU", 0)

    group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(gid)))
    # The engine's own lookup, run inside the group as the replica's code runs.
    found = ray.remote(num_cpus=0)(tensor_parallel_group).options(scheduling_strategy=in_group(group)).remote(2)
    seen["engine_sees_group"] = ray.get(found).id.hex() == gid
    worker = RankWorker.options(scheduling_strategy=in_group(group, bundle=1)).remote()
    seen["worker_gpu_ids"] = ray.get(worker.gpu_ids.remote())

    (replica,) = replica_pids()
    os.kill(replica, signal.SIGKILL)
    wait_for("old group removed", lambda: gid not in created_groups())
    try:
        ray.get(worker.gpu_ids.remote(), timeout=60)
        seen["worker_outlived_replica"] = True
    except ray.exceptions.RayActorError:
        seen["worker_outlived_replica"] = False
    wait_for("replacement group", lambda: created_groups())
    wait_for("replacement healthy", lambda: status(url) == 200)
    seen["health_after_replacement"] = status(url)

    stop_service(APP)
    wait_for("groups removed", lambda: not created_groups())
    wait_for("GPUs back", lambda: ray.available_resources().get("GPU", 0) == seen["gpus"])
    seen["gpus_free_after_delete"] = ray.available_resources().get("GPU", 0)
    return seen


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
