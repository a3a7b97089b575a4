"""`handoff`: how soon a killed training process's GPU memory can be had by the next one.

Why: the pipeline serves with vLLM on the GPUs training has just used, and an engine started
with gpu_memory_utilization=0.9 fails unless 90% of each GPU's memory is free when it starts.
A child process takes an 8B training worker's memory (bf16 weights loaded by load_base, the
LoRA adapter, AdamW's state after one step, and the activations of the next step's forward,
held), says how much it holds, and is SIGKILLed (the hardest way a worker ends); this process then waits
with common.gpu_memory.wait_for_free (NVML when installed) until 90% of the GPU is free, and
allocates that much. Recorded: seconds from the kill until the memory was free, until the
child was reaped, and whether the allocation succeeded. In --smoke the child holds the
narrow model on CPU and only the kill and the reaping are checked.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import time

import torch

from common.gpu_memory import GIB, gpu_memory, wait_for_free

UTILIZATION = 0.9  # what a vLLM engine asks for (gpu_memory_utilization)
READY_TIMEOUT_S = 180
FREE_TIMEOUT_S = 120


def hold_training_state(model_path: str, device: str, smoke: bool, workdir: str, conn) -> None:
    """The child: a training worker's state, held until the process is killed."""
    from pathlib import Path

    from train.model import attach_lora, load_base
    from train.step import forward_loss, make_optimizer

    from .shared import Context, optimizer_step, packed, shape_rows

    ctx = Context(torch.device(device), smoke, Path(workdir))
    cfg = ctx.cfg()
    model = attach_lora(load_base(model_path, cfg, ctx.device), cfg)
    model.train()
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], cfg, ctx.device)
    shape = ctx.shapes["teacher"]
    batch = packed(shape_rows(shape, model.config.vocab_size, seed=0), shape["max_length"], model, ctx.device)
    optimizer_step(model, opt, None, [batch], cfg)
    held = forward_loss(model, batch)  # noqa: F841  (its graph keeps the activations)
    gpu = ctx.device.type == "cuda"
    conn.send(
        {
            "pid": os.getpid(),
            "allocated_gib": torch.cuda.memory_allocated(ctx.device) / GIB if gpu else None,
            "reserved_gib": torch.cuda.memory_reserved(ctx.device) / GIB if gpu else None,
        }
    )
    while True:
        time.sleep(60)


def check_handoff(ctx, model_path: str) -> dict:
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state inherited
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(
        target=hold_training_state, args=(model_path, str(ctx.device), ctx.smoke, str(ctx.workdir), send), daemon=True
    )
    if ctx.gpu:  # this process must leave the memory free itself, or the wait below measures it
        wait_for_free(UTILIZATION, 10)
    before = {i: free / GIB for i, free, _ in gpu_memory()}
    child.start()
    try:
        if not receive.poll(READY_TIMEOUT_S):
            raise TimeoutError(
                f"the child did not hold the training state within {READY_TIMEOUT_S} s (exit code {child.exitcode})"
            )
        out = {
            "child": receive.recv(),
            "free_gib_before_child": before,
            "free_gib_with_child": {i: free / GIB for i, free, _ in gpu_memory()},
        }
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        if ctx.gpu:
            wait_for_free(UTILIZATION, FREE_TIMEOUT_S, poll_s=0.02)
            out["seconds_until_free"] = time.monotonic() - killed
        child.join(FREE_TIMEOUT_S)
        out["seconds_until_reaped"] = time.monotonic() - killed
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    out["child_exit_code"] = child.exitcode
    out["memory_read_through"] = "NVML" if importlib.util.find_spec("pynvml") else "torch.cuda.mem_get_info"
    out["ok"] = child.exitcode == -signal.SIGKILL
    if ctx.gpu:
        out["allocated_fraction"] = UTILIZATION
        try:
            total = torch.cuda.mem_get_info(ctx.device)[1]
            block = torch.empty(int(UTILIZATION * total) // 2**20 * 2**20, dtype=torch.uint8, device=ctx.device)
            out["allocation_succeeded"] = True
            del block
        except torch.cuda.OutOfMemoryError as e:
            out["allocation_succeeded"], out["allocation_error"] = False, str(e).splitlines()[0]
        torch.cuda.empty_cache()
        out["ok"] = out["ok"] and out["allocation_succeeded"]
    else:
        out["gpu_memory"] = {"ok": None, "skipped": "no CUDA GPU: the child's kill and reaping only"}
    return out
