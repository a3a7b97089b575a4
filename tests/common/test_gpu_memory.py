"""Waiting for GPU memory between training and serving, fed readings as NVML would give them."""

import pytest

from common.gpu_memory import GIB, gpu_memory, wait_for_free


def readings(*steps):
    """A `read` callable that returns each reading in turn (then the last one again)."""
    steps = list(steps)
    return lambda: steps.pop(0) if len(steps) > 1 else steps[0]


def test_returns_at_once_when_every_gpu_has_the_memory():
    lines = []
    read = readings([(0, 75 * GIB, 80 * GIB), (1, 72 * GIB, 80 * GIB)])
    assert wait_for_free(0.9, timeout_s=10, read=read, log=lines.append) == 0.0
    assert lines == []


def test_waits_until_the_memory_is_freed_and_says_so_once():
    lines = []
    read = readings(
        [(0, 10 * GIB, 80 * GIB), (1, 75 * GIB, 80 * GIB)],
        [(0, 40 * GIB, 80 * GIB), (1, 75 * GIB, 80 * GIB)],
        [(0, 73 * GIB, 80 * GIB), (1, 75 * GIB, 80 * GIB)],
    )
    waited = wait_for_free(0.9, timeout_s=10, poll_s=0.01, read=read, log=lines.append)
    assert 0.0 < waited < 5
    assert len(lines) == 1 and "GPU 0: 10.0 GiB free, 72.0 GiB needed" in lines[0] and "GPU 1" not in lines[0]


def test_times_out_naming_the_gpu_short_of_memory():
    lines = []
    read = readings([(0, 75 * GIB, 80 * GIB), (3, 20 * GIB, 80 * GIB)])
    with pytest.raises(TimeoutError, match=r"after 0.05 s: GPU 3: 20.0 GiB free, 72.0 GiB needed") as e:
        wait_for_free(0.9, timeout_s=0.05, poll_s=0.01, read=read, log=lines.append)
    assert "GPU 0" not in str(e.value)
    assert len(lines) == 1 and "GPU 3" in lines[0]


def test_no_gpu_means_no_wait():
    assert wait_for_free(0.9, timeout_s=0, read=lambda: [], log=pytest.fail) == 0.0


def test_this_machine_reads_every_gpu_torch_sees_and_none_without_one():
    import torch

    found = gpu_memory()  # NVML may see more GPUs than CUDA_VISIBLE_DEVICES leaves torch
    assert len(found) >= torch.cuda.device_count() and (found == [] if not torch.cuda.is_available() else found)
    assert all(0 <= free <= total for _, free, total in found)
