"""The GPU hand-off between training and serving (jobs/runtime/handoff.py) on a CPU cluster: nothing to
wait for, so no stage is held back. The waiting itself is tested on readings in
tests/common/test_gpu_memory.py, and on a real GPU by bench/gpu_check.py's handoff check."""

import time


def test_a_cluster_without_gpus_hands_off_at_once(ray_cluster):
    from jobs.runtime.handoff import wait_for_gpus

    started = time.time()
    assert wait_for_gpus(0.9, "starting numbers", timeout_s=5) == 0.0
    assert time.time() - started < 5


def test_each_gpu_node_is_probed_on_itself(ray_cluster):
    """The probe runs where it is sent (a node's GPUs are read on that node): here, on this node,
    which has no GPU for NVML or torch to report, so it returns at once."""
    import ray

    from jobs.runtime.handoff import _wait_on_node

    probe = ray.remote(num_cpus=0)(_wait_on_node)
    assert ray.get(probe.remote(0.9, 5.0, "training")) == 0.0
