"""What a Ray cluster has now, and the most it can ever grow to.

Placement checks a request for GPUs against the most the cluster can ever have,
not against what it has this minute: on an autoscaling cluster a job starts on
a CPU head node and the autoscaler adds GPU nodes when Ray Train or Serve ask
for them. The config the cluster's autoscaler runs with gives that maximum: its
node types and worker bounds. It is found from the autoscaler itself (Ray's
monitor process on the head, started by `ray start --head --autoscaling-config=PATH`,
names the cluster's GCS address and PATH on its command line), so a head started
by hand or by a local autoscaling test is read as one started by `ray up`, which
leaves the config at `~/ray_bootstrap_config.yaml` (read when no monitor is
found: a driver off the head node). Without one (a fixed cluster, a laptop) the
maximum is what is there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

BOOTSTRAP_CONFIG = Path.home() / "ray_bootstrap_config.yaml"
# the autoscaler's entry points: ray/autoscaler/_private/monitor.py (v1), ray/autoscaler/v2/monitor.py
MONITOR = "ray/autoscaler/"


@dataclass(frozen=True)
class Capacity:
    cpus: float  # now
    node_gpus: tuple[float, ...]  # GPUs of each GPU node now
    max_node_gpus: tuple[float, ...]  # ... at the cluster's largest (the autoscaler's bound; else = node_gpus)
    autoscaler: bool = False
    max_cpus: float | None = None  # CPUs at the cluster's largest (the autoscaler's bound); None: the CPUs there now

    @property
    def cpus_at_most(self) -> float:
        return max(self.cpus, self.max_cpus or 0.0)

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


def launcher_nodes(config: dict, resource: str) -> list[float]:
    """How much of `resource` (CPU, GPU, a custom one) each node of a Ray cluster launcher config
    holds when the cluster is at its largest for it: the head once, then worker nodes filling the
    global `max_workers` bound, the types richest in it first, each type up to its own `max_workers`."""
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    nodes = [float(types.get(head, {}).get("resources", {}).get(resource, 0))]
    workers_left = config.get("max_workers", 0)
    workers = [node for name, node in types.items() if name != head]
    for node in sorted(workers, key=lambda node: -node.get("resources", {}).get(resource, 0)):
        count = max(0, min(node.get("max_workers", 0), workers_left))
        nodes += [float(node.get("resources", {}).get(resource, 0))] * count
        workers_left -= count
    return nodes


def launcher_node_gpus(config: dict) -> tuple[float, ...]:
    """GPUs of each GPU node a Ray cluster launcher config can run at once, at its largest."""
    return tuple(sorted((n for n in launcher_nodes(config, "GPU") if n > 0), reverse=True))


def autoscaler_config_path(gcs_address: str | None, proc: Path = Path("/proc")) -> Path | None:
    """The config file the autoscaler of the cluster at `gcs_address` (host:port) runs with, read from
    its monitor process's command line (`--gcs-address=HOST:PORT ... --autoscaling-config=PATH`) on
    this machine. Matched on the port alone: one machine serves one GCS per port, whatever address
    (loopback, the node's IP) each side names it by. None: no such process here (a driver off the
    head node, an autoscaler-less cluster) or no address."""
    port = (gcs_address or "").rpartition(":")[2]
    if not port.isdigit():
        return None
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:  # a process that ended meanwhile, or another user's
            continue
        if not any(MONITOR in arg and arg.endswith("monitor.py") for arg in args[:3]):
            continue
        flags = dict(arg[2:].split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)
        if flags.get("gcs-address", "").rpartition(":")[2] == port and flags.get("autoscaling-config"):
            return Path(os.path.expanduser(flags["autoscaling-config"]))
    return None


def load_launcher_config(gcs_address: str | None = None, proc: Path = Path("/proc")) -> dict | None:
    """The launcher config of the cluster at `gcs_address` (default: $RAY_ADDRESS): the file its
    autoscaler runs with, else `~/ray_bootstrap_config.yaml` (a head started by `ray up`), else None.
    `ray start --autoscaling-config` takes YAML or JSON; YAML reads both."""
    path = autoscaler_config_path(gcs_address or os.environ.get("RAY_ADDRESS"), proc)
    path = path if path and path.is_file() else BOOTSTRAP_CONFIG
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def capacity(nodes: list[dict], cpus: float, config: dict | None) -> Capacity:
    """A cluster's capacity from its node table (`ray.nodes()`), its CPUs now and its launcher config."""
    node_gpus = tuple(
        sorted((g for n in nodes if n.get("Alive") and (g := n["Resources"].get("GPU", 0.0)) > 0), reverse=True)
    )
    max_node_gpus = launcher_node_gpus(config) if config else ()
    if sum(max_node_gpus) < sum(node_gpus):
        max_node_gpus = node_gpus
    max_cpus = sum(launcher_nodes(config, "CPU")) if config else None
    return Capacity(float(cpus), node_gpus, max_node_gpus, autoscaler=bool(config), max_cpus=max_cpus)


def cluster_capacity(launcher_config: dict | None = None) -> Capacity:
    """The connected Ray cluster's capacity (call after ray.init)."""
    import ray

    config = (
        launcher_config if launcher_config is not None else load_launcher_config(ray.get_runtime_context().gcs_address)
    )
    return capacity(ray.nodes(), ray.cluster_resources().get("CPU", 0), config)


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
        text += f", at most {cap.cpus_at_most:g} CPUs and {cap.max_gpus:g} GPUs with the autoscaler (at most {cap.max_gpus_per_node:g} on one node)"
    return text
