"""How many training workers and Serve replicas each stage gets on a cluster, checked up front.

Training and serving take turns on the same GPUs: each Serve application is torn
down when its stage (numbers, evaluate) ends, so the training stages between
them get every GPU back. A preset therefore asks for

- `teacher.num_workers` / `student.num_workers`: one GPU each (DDP replicates
  the model, FSDP shards it);
- `service.replicas` / `evaluate.replicas` with `gpus_per_replica` GPUs each
  (= `service.tensor_parallel_size` for a model split across GPUs, which must
  sit on one node), or on CPU `cpus_per_replica` CPUs each.

`auto` fills the GPU nodes the cluster has now; on an autoscaling cluster that
has none yet, one node of the largest kind it can add (so `auto` never scales a
cluster to its maximum). On CPU it fills the CPUs.

`plan` resolves `auto` and checks every request against the most the cluster
can ever have (train/cluster.py: with an autoscaler, its configured maximum),
so a preset that can never fit fails before any work starts, with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import ConfigError
from jobs.experiment.config import ExperimentConfig
from train.cluster import Capacity, auto_workers, describe
from train.config import TrainConfig, resolve_batch
from train.model import check_hardware


class PlacementError(ConfigError):
    """The config asks for more than the cluster can ever give, or for hardware it lacks."""


@dataclass(frozen=True)
class Placement:
    teacher_workers: int
    student_workers: int
    service_replicas: int  # generation (numbers stage)
    eval_replicas: int  # scoring (evaluate stage)
    arm_runs: int = 1  # training runs of arms at once, each training its share of the arms one after another

    def summary(self, cfg: ExperimentConfig) -> str:
        def replicas(n, place):
            each = f"{place.gpus_per_replica:g} GPU" if place.gpus_per_replica else f"{place.cpus_per_replica:g} CPU"
            return f"{n} x {each}"

        return (
            f"teacher {self.teacher_workers} worker(s) ({cfg.teacher.strategy}), student/control {self.student_workers},"
            f" generation {replicas(self.service_replicas, cfg.service)}, evaluation {replicas(self.eval_replicas, cfg.evaluate)},"
            f" arms in {self.arm_runs} training run(s) at once"
        )


def _workers(name: str, train: TrainConfig, cap: Capacity, problems: list[str]) -> int:
    workers = auto_workers(train.use_gpu, cap) if train.num_workers == "auto" else train.num_workers
    try:
        check_hardware(train, cuda_available=cap.max_gpus > 0)  # the trainer's own check, run before any work
    except ConfigError as err:
        problems.append(f"{name}.{err}")
    if train.use_gpu and workers > cap.max_gpus:
        problems.append(f"{name}: {workers} GPU workers need {workers} GPUs; the cluster can have {cap.max_gpus:g}")
    try:
        resolve_batch(train, workers)  # a global batch these workers cannot divide stops here, not mid-run
    except ConfigError as err:
        problems.append(f"{name}: {err}")
    return workers


def _replicas(name: str, place, tensor_parallel: int, cap: Capacity, problems: list[str]) -> int:
    gpus = place.gpus_per_replica
    if not gpus:
        if tensor_parallel > 1:
            problems.append(
                f"service.tensor_parallel_size={tensor_parallel} needs {name}.gpus_per_replica >= {tensor_parallel}"
            )
        return max(1, int(cap.cpus // place.cpus_per_replica)) if place.replicas == "auto" else place.replicas
    fitting = cap.groups_fitting(gpus, cap.max_node_gpus)
    replicas = cap.groups_fitting(gpus, cap.auto_node_gpus) if place.replicas == "auto" else place.replicas
    if tensor_parallel > 1 and gpus != tensor_parallel:  # one GPU bundle per rank (serve/replica_placement.py)
        problems.append(f"{name}.gpus_per_replica={gpus:g} must equal service.tensor_parallel_size={tensor_parallel}")
    if gpus > cap.max_gpus_per_node:
        problems.append(
            f"{name}: a replica needs {gpus:g} GPUs on one node; the largest node has {cap.max_gpus_per_node:g}"
        )
    elif replicas > fitting:
        problems.append(f"{name}: {replicas} replicas x {gpus:g} GPUs on one node each; {fitting} fit")
    return max(replicas, 1)


def _arm_runs(student: TrainConfig, workers: int, cap: Capacity) -> int:
    """GPU: as many single-group runs as the GPUs hold side by side (8 GPUs, 1-GPU students: 8 at
    once). CPU: one run that trains every arm over one copy of the base, since a CPU gains
    nothing from two runs at once and each run pays the worker start-up again."""
    if not student.use_gpu:
        return 1
    return max(1, int(sum(cap.auto_node_gpus) // workers))


def place(cfg: ExperimentConfig, cap: Capacity) -> Placement:
    """Resolve `auto` counts for this cluster; raise PlacementError listing every request that cannot fit."""
    problems: list[str] = []
    tp = cfg.service.tensor_parallel_size
    student_workers = _workers("student", cfg.student, cap, problems)
    placement = Placement(
        teacher_workers=_workers("teacher", cfg.teacher, cap, problems),
        student_workers=student_workers,
        service_replicas=_replicas("service", cfg.service, tp, cap, problems),
        eval_replicas=_replicas("evaluate", cfg.evaluate, tp, cap, problems),
        arm_runs=_arm_runs(cfg.student, student_workers, cap),
    )
    if problems:
        raise PlacementError(
            f"config {cfg.name!r} does not fit this cluster ({describe(cap)}):\n  - " + "\n  - ".join(problems)
        )
    return placement


def resolved(cfg: ExperimentConfig, placement: Placement) -> ExperimentConfig:
    """The config with every `auto` count replaced by the placement's number."""
    return cfg.replace(
        teacher=cfg.teacher.replace(num_workers=placement.teacher_workers),
        student=cfg.student.replace(num_workers=placement.student_workers),
        service=cfg.service.replace(replicas=placement.service_replicas),
        evaluate=cfg.evaluate.replace(replicas=placement.eval_replicas),
    )
