"""Placement: how many training workers and Serve replicas each preset gets on a cluster shape,
and the presets that can never fit failing before any work starts, with the numbers."""

from pathlib import Path

import pytest
import yaml

from jobs.experiment.config import load_experiment
from jobs.sizing.placement import PlacementError, place, resolved
from train.cluster import Capacity, cluster_capacity, launcher_node_gpus

ROOT = Path(__file__).resolve().parents[3]
LAUNCHER = yaml.safe_load((ROOT / "cluster.yaml").read_text())


def preset(name, *overrides):
    return load_experiment(ROOT / "configs" / f"{name}.yaml", list(overrides))


def fixed(cpus, *node_gpus):
    """A cluster without an autoscaler: what is there is all there will ever be."""
    return Capacity(cpus, tuple(node_gpus), tuple(node_gpus))


def autoscaling(now=()):
    return Capacity(16, tuple(now), launcher_node_gpus(LAUNCHER), autoscaler=True)


def counts(p):
    return p.teacher_workers, p.student_workers, p.service_replicas, p.eval_replicas


def test_tiny_on_a_two_core_laptop():
    # two generation replicas: the tiny preset serves numbers with transformers
    assert counts(place(preset("tiny"), fixed(2))) == (2, 2, 2, 2)


@pytest.mark.parametrize(
    "cap, expected",
    [
        (fixed(26, 1), (1, 1, 1, 1)),  # the scaling note's 1 x H100
        (fixed(192, 8), (8, 8, 8, 8)),  # one engine replica per GPU
        (fixed(96, 4, 4), (8, 8, 8, 8)),  # two nodes
        (autoscaling(), (8, 8, 8, 8)),  # nothing up yet: one node of the largest kind, not all 18 GPUs
        (autoscaling(now=(1,)), (1, 1, 1, 1)),  # what is there now
    ],
)
def test_llama_8b_one_worker_and_one_replica_per_gpu(cap, expected):
    assert counts(place(preset("llama-8b"), cap)) == expected


def test_llama_70b_on_8_gpus_and_tensor_parallel_replicas():
    cfg = preset("llama-70b-qlora")
    assert counts(place(cfg, fixed(192, 8))) == (8, 8, 2, 2)  # 2 replicas of 4 GPUs per node
    assert counts(place(cfg, autoscaling())) == (8, 8, 2, 2)
    assert counts(place(cfg, fixed(384, 8, 8))) == (8, 8, 4, 4)
    # Ten 1-GPU nodes hold 8 workers but no 4-GPU replica.
    with pytest.raises(PlacementError, match="a replica needs 4 GPUs on one node; the largest node has 1"):
        place(cfg, fixed(160, *[1] * 10))


def test_resolved_config_has_numbers_not_auto():
    cfg = resolved(preset("llama-8b"), place(preset("llama-8b"), fixed(192, 8)))
    assert (cfg.teacher.num_workers, cfg.student.num_workers, cfg.service.replicas, cfg.evaluate.replicas) == (
        8,
        8,
        8,
        8,
    )


def test_more_gpus_than_the_cluster_can_ever_have_names_the_numbers():
    with pytest.raises(PlacementError) as err:
        place(preset("llama-70b-qlora"), fixed(64, 4))
    assert "teacher: 8 GPU workers need 8 GPUs; the cluster can have 4" in str(err.value)
    # With the autoscaler's bound (18 GPUs) counted, not just what is up now.
    with pytest.raises(PlacementError, match="32 GPU workers need 32 GPUs; the cluster can have 18"):
        place(preset("llama-70b-qlora", "teacher.num_workers=32"), autoscaling())
    with pytest.raises(PlacementError, match="evaluate: 5 replicas x 4 GPUs on one node each; 4 fit"):
        place(preset("llama-70b-qlora", "evaluate.replicas=5"), autoscaling())


def test_four_bit_without_a_gpu_says_it_needs_one():
    with pytest.raises(PlacementError, match="teacher.quantization=4bit needs a CUDA GPU"):
        place(preset("llama-70b-qlora"), fixed(2))
    with pytest.raises(PlacementError, match="needs a CUDA GPU"):
        place(preset("tiny", "teacher.quantization=4bit", "student.quantization=4bit"), fixed(2))


def test_tensor_parallel_needs_one_gpu_per_rank():
    for gpus in (2, 8):  # fewer cannot hold the ranks; more would be reserved and never used
        with pytest.raises(
            PlacementError, match=f"service.gpus_per_replica={gpus} must equal service.tensor_parallel_size=4"
        ):
            place(preset("llama-70b-qlora", f"service.gpus_per_replica={gpus}"), fixed(192, 8))


def test_capacity_of_a_real_ray_cluster(ray_cluster):
    cap = cluster_capacity(launcher_config={})
    assert (cap.cpus, cap.gpus, cap.max_gpus, cap.autoscaler) == (2.0, 0, 0, False)
    with_launcher = cluster_capacity(launcher_config=LAUNCHER)
    assert with_launcher.autoscaler and with_launcher.max_gpus == 18 and with_launcher.max_gpus_per_node == 8
    assert counts(place(preset("llama-70b-qlora"), with_launcher)) == (8, 8, 2, 2)


def test_auto_workers_leave_a_cpu_to_ray_data_and_fill_gpus():
    from train.cluster import auto_workers

    assert auto_workers(False, fixed(2)) == 1 and auto_workers(False, fixed(16)) == 15
    assert auto_workers(True, fixed(26, 4, 4)) == 8 and auto_workers(True, autoscaling()) == 8
