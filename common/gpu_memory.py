"""Free GPU memory, read without Ray: what a step that starts a vLLM engine waits on after training,
so the engine starts once the trainer's processes have given their memory back."""

from __future__ import annotations

import time
from collections.abc import Callable

GIB = 2**30


def gpu_memory() -> list[tuple[int, int, int]]:
    """(index, free bytes, total bytes) of every GPU of this machine; [] without one. Read through
    NVML (the nvidia-ml-py package, which vLLM installs), which creates no CUDA context and sees
    every GPU of the machine whatever CUDA_VISIBLE_DEVICES says; else through torch, which
    sees only the GPUs CUDA_VISIBLE_DEVICES leaves and creates a CUDA context on each in this
    process (about 0.5 GiB, held for the process's life)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, or no driver
        return _torch_memory()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [(i, int(m.free), int(m.total)) for i, m in enumerate(map(pynvml.nvmlDeviceGetMemoryInfo, handles))]
    finally:
        pynvml.nvmlShutdown()


def _torch_memory() -> list[tuple[int, int, int]]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [(i, *torch.cuda.mem_get_info(i)) for i in range(torch.cuda.device_count())]


def wait_for_free(
    fraction: float, timeout_s: float, poll_s: float = 0.5, read: Callable = gpu_memory, log: Callable = print
) -> float:
    """Wait until every GPU has at least `fraction` of its memory free (what a vLLM engine with
    gpu_memory_utilization=`fraction` needs to start); return the seconds waited (0.0 at once when
    it already has, or without a GPU). One line is logged when waiting starts, naming each GPU
    short of it; TimeoutError, naming them too, once `timeout_s` has passed."""
    start = time.monotonic()
    short = _short(read(), fraction)
    if not short:
        return 0.0
    log(f"waiting up to {timeout_s:g} s for {fraction:.0%} of each GPU's memory to be free: {short}")
    while short:
        if time.monotonic() - start >= timeout_s:
            raise TimeoutError(f"GPU memory still in use after {timeout_s:g} s: {short}")
        time.sleep(poll_s)
        short = _short(read(), fraction)
    return time.monotonic() - start


def _short(readings, fraction: float) -> str:
    """'GPU i: x GiB free, y GiB needed' for each GPU below `fraction` free; '' when none is."""
    return ", ".join(
        f"GPU {i}: {free / GIB:.1f} GiB free, {fraction * total / GIB:.1f} GiB needed"
        for i, free, total in readings
        if free < fraction * total
    )
