"""The hand-off of GPUs between training and serving: wait until the last stage's memory is free.

Training and serving take turns on the same GPUs (jobs/sizing/placement.py). Both
let go asynchronously: Ray Train's workers and a deleted Serve replica's engine
processes exit after the call that ended them returned, and their CUDA memory is
freed when they do. vLLM refuses to start unless a GPU's free memory is at least
`gpu_memory_utilization` x its total, so a replica started at once can fail on
memory still held; a training worker can run out of memory the same way. Before
a stage on GPUs, one task on every GPU node waits (bounded, saying what it waits
for) until each GPU there has that much free (common/gpu_memory.py reads it
through NVML, which sees every GPU of the node whatever Ray assigned). Past the
bound the stage fails with the GPUs and their free memory named, instead of an
engine or worker failing later on an out-of-memory error.
"""

from __future__ import annotations

HANDOFF_TIMEOUT_S = 300.0  # a 70B replica's engine workers take tens of seconds to exit


def _wait_on_node(fraction: float, timeout_s: float, what: str) -> float:
    import socket

    from common.gpu_memory import wait_for_free

    return wait_for_free(
        fraction,
        timeout_s,
        log=lambda line: print(f"[handoff] {socket.gethostname()}, before {what}: {line}", flush=True),
    )


def wait_for_gpus(fraction: float, what: str, timeout_s: float = HANDOFF_TIMEOUT_S) -> float:
    """Block until every GPU of every GPU node has `fraction` of its memory free, or raise
    RuntimeError naming the GPUs short of it after `timeout_s`; returns the longest wait (0.0 at
    once on a cluster without GPUs)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0]
    probe = ray.remote(num_cpus=0, max_retries=0)(_wait_on_node)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            fraction, timeout_s, what
        )
        for node in nodes
    ]
    try:
        waited = ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, TimeoutError):
            raise RuntimeError(f"GPU memory still held before {what}: {err.cause}") from None
        raise
    longest = max(waited, default=0.0)
    if longest > 0:
        print(f"[handoff] GPUs free for {what} after {longest:.0f} s", flush=True)
    return longest
