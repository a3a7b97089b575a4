"""Where a replica of the inference service runs, and what it holds: one GPU, or one placement group per tensor-parallel replica.

A replica on one GPU (or on CPUs) is a plain actor that holds its resources itself.

A tensor-parallel replica (`tensor_parallel_size` > 1) is placed as Ray's own LLM serving places
one: Serve reserves a placement group with one bundle per tensor-parallel rank, each bundle one GPU,
and the replica actor sits in bundle 0 holding CPUs only. vLLM's Ray executor then starts one worker
actor per GPU bundle of that group (the engine is handed the group, `VLLMEngine`). Serve creates the
group with the replica and removes it with the replica, whether the replica is stopped, scaled
down or dies, and Ray kills every actor of a removed group: no engine worker can keep a GPU past
its replica and into the next training stage. (The engine's `mp` executor instead ran the workers
as the replica's child processes, which a replica killed outright leaves running.)

Bundles are packed on one node (STRICT_PACK): tensor-parallel ranks all-reduce in every layer, over
NVLink within a node; over the network the replica would run, slowly. `jobs.sizing.placement` checks that
one node holds a replica's GPUs before any work starts.

    replica_options(tensor_parallel=4, num_cpus=1, num_gpus=4)
    # {"ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
    #  "placement_group_bundles": [{"CPU": 1, "GPU": 1}, {"GPU": 1}, {"GPU": 1}, {"GPU": 1}],
    #  "placement_group_strategy": "STRICT_PACK"}
"""

from __future__ import annotations

from serve.settings import ServiceError

STRATEGY = "STRICT_PACK"


def replica_options(tensor_parallel: int, num_cpus: float, num_gpus: float) -> dict:
    """Serve deployment options placing one replica: its actor's resources and, for a
    tensor-parallel replica on GPUs, its placement group. ServiceError when the GPUs asked for
    are not one per rank."""
    if tensor_parallel <= 1 or not num_gpus:
        return {"ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus}}
    if num_gpus != tensor_parallel:
        raise ServiceError(
            f"a tensor-parallel replica holds one GPU per rank: num_gpus={num_gpus:g} "
            f"with tensor_parallel_size={tensor_parallel}; set num_gpus to {tensor_parallel}"
        )
    bundles = [{"CPU": num_cpus, "GPU": 1}] + [{"GPU": 1} for _ in range(tensor_parallel - 1)]
    return {
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": 0},
        "placement_group_bundles": bundles,
        "placement_group_strategy": STRATEGY,
    }


def one_gpu_per_rank(bundles: list[dict], tensor_parallel: int) -> bool:
    """The bundles hold exactly `tensor_parallel` GPUs, one per bundle (vLLM's Ray executor puts one rank in each)."""
    gpu_bundles = [b for b in bundles if b.get("GPU")]
    return len(gpu_bundles) == tensor_parallel and all(b["GPU"] == 1 for b in gpu_bundles)


def check_deployment(deployment: dict, tensor_parallel: int) -> None:
    """A Serve config's deployment entry (serve/config.yaml) for a tensor-parallel replica on GPUs:
    ServiceError unless it is placed as `replica_options` places one, naming what to write."""
    actor = deployment.get("ray_actor_options") or {}
    bundles = deployment.get("placement_group_bundles")
    if tensor_parallel <= 1 or not (actor.get("num_gpus") or bundles):
        return
    expected = replica_options(tensor_parallel, actor.get("num_cpus", 1), tensor_parallel)
    if actor.get("num_gpus"):
        raise ServiceError(
            f"tensor_parallel_size={tensor_parallel}: the replica actor holds no GPU itself (ray_actor_options.num_gpus: 0); "
            f"its GPUs are placement_group_bundles: {expected['placement_group_bundles']}"
        )
    if not one_gpu_per_rank(bundles, tensor_parallel):
        raise ServiceError(
            f"tensor_parallel_size={tensor_parallel} needs {tensor_parallel} placement_group_bundles of one GPU each, "
            f"the first also holding the replica's CPUs: {expected['placement_group_bundles']}; got {bundles}"
        )
    if deployment.get("placement_group_strategy") != STRATEGY:
        raise ServiceError(
            f"tensor_parallel_size={tensor_parallel}: placement_group_strategy must be {STRATEGY} (ranks on one node)"
        )


def tensor_parallel_group(tensor_parallel: int):
    """The placement group this replica runs in, for vLLM's Ray executor to start its workers in.

    Called inside the replica. ServiceError when the replica was not placed with one GPU bundle
    per rank: vLLM would otherwise reserve GPUs of its own from inside the replica, a group that
    nothing removes when the replica dies."""
    import ray

    group = ray.util.get_current_placement_group()
    if not (group and one_gpu_per_rank(group.bundle_specs, tensor_parallel)):
        found = group.bundle_specs if group else "no placement group"
        raise ServiceError(
            f"tensor_parallel_size={tensor_parallel} needs the replica placed with {tensor_parallel} one-GPU "
            f"placement_group_bundles (serve.replica_placement.replica_options); found {found}"
        )
    return group
