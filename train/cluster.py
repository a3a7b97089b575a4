"""What a Ray cluster has now, and the most it can ever grow to.

Placement checks a request for GPUs against the most the cluster can ever have,
not against what it has this minute: on an autoscaling cluster a job starts on
a CPU head node and the autoscaler adds GPU nodes when Ray Train or Serve ask
for them. `ray up` leaves the launcher config on the head node
(`~/ray_bootstrap_config.yaml`); its node types and worker bounds give that
maximum. Without one (a fixed cluster, a laptop) the maximum is what is there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

BOOTSTRAP_CONFIG = Path.home() / "ray_bootstrap_config.yaml"


@dataclass(frozen=True)
class Capacity:
    cpus: float  # now
    node_gpus: tuple[float, ...]  # GPUs of each GPU node now
    max_node_gpus: tuple[float, ...]  # ... at the cluster's largest (the autoscaler's bound; else = node_gpus)
    autoscaler: bool = False

    @property
    def gpus(self) -> float:
        return sum(self.node_gpus)

    @property
    def max_gpus(self) -> float:
        return sum(self.max_node_gpus)

    @property
    def max_gpus_per_node(self) -> float:
        return max(self.max_node_gpus, default=0.0)

    @property
    def auto_node_gpus(self) -> tuple[float, ...]:
        """What `auto` counts fill: the GPU nodes there now, or with none yet, one node of the
        largest kind the autoscaler can add (not every node it could ever add)."""
        return self.node_gpus or self.max_node_gpus[:1]

    @staticmethod
    def groups_fitting(gpus_each: float, node_gpus: tuple[float, ...]) -> int:
        """How many groups of `gpus_each` GPUs, each on one node (a tensor-parallel replica), fit."""
        return sum(int(n // gpus_each) for n in node_gpus)


def launcher_node_gpus(config: dict) -> tuple[float, ...]:
    """GPUs of each node a Ray cluster launcher config can run at once, at its largest.

    The head node counts once; worker nodes fill the global `max_workers` bound,
    GPU-richest node types first, each type up to its own `max_workers`.
    """
    types = config.get("available_node_types") or {}
    nodes = [float(types.get(config.get("head_node_type"), {}).get("resources", {}).get("GPU", 0))]
    workers_left = config.get("max_workers", 0)
    for node in sorted(types.values(), key=lambda node: -node.get("resources", {}).get("GPU", 0)):
        count = max(0, min(node.get("max_workers", 0), workers_left))
        nodes += [float(node.get("resources", {}).get("GPU", 0))] * count
        workers_left -= count
    return tuple(sorted((n for n in nodes if n > 0), reverse=True))


def load_launcher_config(path: Path = BOOTSTRAP_CONFIG) -> dict | None:
    """The cluster launcher config on this (head) node, if the cluster was started by `ray up`."""
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def cluster_capacity(launcher_config: dict | None = None) -> Capacity:
    """The connected Ray cluster's capacity (call after ray.init)."""
    import ray

    node_gpus = tuple(
        sorted((g for n in ray.nodes() if n.get("Alive") and (g := n["Resources"].get("GPU", 0.0)) > 0), reverse=True)
    )
    config = launcher_config if launcher_config is not None else load_launcher_config()
    max_node_gpus = launcher_node_gpus(config) if config else ()
    if sum(max_node_gpus) < sum(node_gpus):
        max_node_gpus = node_gpus
    return Capacity(float(ray.cluster_resources().get("CPU", 0)), node_gpus, max_node_gpus, autoscaler=bool(config))


def auto_workers(use_gpu: bool, cap: Capacity) -> int:
    """`num_workers: auto`: one worker per GPU (Capacity.auto_node_gpus); on CPU, one per CPU but
    one, which is left to Ray Data (it otherwise waits forever behind the workers)."""
    if use_gpu:
        return max(1, int(sum(cap.auto_node_gpus)))
    return max(1, int(cap.cpus) - 1)


def describe(cap: Capacity) -> str:
    """One line for logs and error messages."""
    text = f"{cap.cpus:g} CPUs and {cap.gpus:g} GPUs now"
    if cap.autoscaler:
        text += f", at most {cap.max_gpus:g} GPUs with the autoscaler (at most {cap.max_gpus_per_node:g} on one node)"
    return text
