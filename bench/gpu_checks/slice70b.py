"""`70b_slice_4bit_ddp`: QLoRA at Llama-3.1-70B width inside a real DistributedDataParallel, its
optimizer checkpoint saved and resumed, and per-layer figures extrapolated to 80 layers.

Why: the 70B preset (configs/llama-70b-qlora.yaml) trains a 4-bit base with gradient checkpointing
under DDP, which one GPU never builds (`wrap_distributed` leaves a lone worker bare): here
`wrap_distributed(..., ddp_alone=True)` builds the wrapper a group would get, at world size 1
(NCCL; gloo in --smoke, where the base is not quantized: bitsandbytes needs CUDA, nor without bitsandbytes). Checked on a
4-layer slice: the DDP gradients of two micro-batches accumulated under no_sync equal the plain
model's; the loss falls; a checkpoint written by the trainer's own functions (trainable_state,
get_optimizer_state_dict, train/outputs.py write_checkpoint) and read back by them (restore,
read_state, set_optimizer_state_dict into a fresh optimizer, as a resumed worker does) restores
the weights exactly and makes the next step the same as the one taken without the round trip.
The same steps on a 2-layer slice give per-layer weight memory, peak memory and step time:
x(80) = x(4) + 76 * (x(4) - x(2)) / 2. World size 1 has no gradient all-reduce to time.
"""

from __future__ import annotations

import functools
import importlib.util
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict

from train.model import attach_lora, count_parameters, load_base, trainable_state, unwrap, wrap_distributed
from train.outputs import read_state, restore, write_checkpoint
from train.step import forward_loss, lr_factor, make_optimizer, peak_flops

from .shared import (
    Context,
    Folder,
    allocated_gib,
    clock,
    flat_grads,
    flat_weights,
    free,
    optimizer_step,
    packed,
    peak_gib,
    rel,
    reset_peak,
    shape_rows,
)

DEPTHS = (4, 2)
LAYERS_70B = 80
# the 70B teacher's micro-batch (rows as in shared.SHAPES)
SHAPE = dict(rows=4, max_length=512, shortest=64, longest=448)
SMOKE_SHAPE = dict(rows=4, max_length=64, shortest=8, longest=56)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # the trainer's checkpoint options


def not_quantized(ctx: Context) -> str | None:
    """Why the base cannot be 4-bit here (then it is bf16 on GPU, float32 on CPU), or None."""
    if not ctx.gpu:
        return "bitsandbytes needs CUDA"
    return None if importlib.util.find_spec("bitsandbytes") else "bitsandbytes is not installed"


def setup(ctx: Context, folder: str, total_steps: int):
    cfg = ctx.cfg(quantization="none" if not_quantized(ctx) else "4bit", gradient_checkpointing=True, grad_accum=2)
    before = allocated_gib(ctx.device)
    model = attach_lora(load_base(folder, cfg, ctx.device), cfg)
    ddp = wrap_distributed(model, cfg, ctx.device, ddp_alone=True)
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise RuntimeError(
            f"wrap_distributed(ddp_alone=True) returned {type(ddp).__name__}, not DistributedDataParallel"
        )
    ddp.train()
    weights = allocated_gib(ctx.device) - before if ctx.gpu else None
    return cfg, ddp, *fresh_optimizer(ctx, ddp, cfg, total_steps), weights


def fresh_optimizer(ctx: Context, ddp, cfg, total_steps: int):
    opt = make_optimizer([p for p in ddp.parameters() if p.requires_grad], cfg, ctx.device)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(lr_factor, total=total_steps, cfg=cfg))


def check_70b_slice(ctx: Context, steps: int) -> dict:
    """`steps` timed optimizer steps (after one warm-up), each of the same two micro-batches, at each depth."""
    shape = SMOKE_SHAPE if ctx.smoke else SHAPE
    total = steps + 2  # the schedule's length: warm-up, timed steps, the checkpoint's step
    why = not_quantized(ctx)
    depths, out = (
        {},
        {
            "quantization": "none" if why else "4bit",
            "gradient_checkpointing": True,
            "world_size": 1,
            "backend": torch.distributed.get_backend(),
            "micro_batches_per_step": 2,
            **shape,
        },
    )
    if why:  # the rest is checked on the unquantized base; its figures are not 4-bit's
        out["4bit"] = {"ok": None, "skipped": why}
    for layers in DEPTHS:
        free(ctx.device)
        reset_peak(ctx.device)
        left = allocated_gib(ctx.device)  # what the previous depth left behind: should be ~0
        cfg, ddp, opt, sched, weights = setup(
            ctx, ctx.model("70b", None if layers == ctx.width("70b")["num_hidden_layers"] else layers), total
        )
        micro = [
            packed(shape_rows(shape, ctx.width("70b")["vocab_size"], seed), shape["max_length"], ddp, ctx.device)
            for seed in (0, 1)
        ]
        n_params, _ = count_parameters(ddp)
        if layers == DEPTHS[0]:
            out["ddp_vs_plain_gradient_gap"] = ddp_gradient_gap(ddp, micro)
        losses = [optimizer_step(ddp, opt, sched, micro, cfg)]
        reset_peak(ctx.device)
        started = clock(ctx.device)
        losses += [optimizer_step(ddp, opt, sched, micro, cfg) for _ in range(steps)]
        depths[layers] = {
            "parameters": n_params,
            "allocated_before_gib": left,
            "weights_gib": weights,
            "peak_memory_gib": peak_gib(ctx.device),
            "step_s": (clock(ctx.device) - started) / steps,
            "tokens_per_step": sum(int(b["real_tokens"]) for b in micro),
            "first_loss": losses[0],
            "last_loss": losses[-1],
        }
        if layers == DEPTHS[0]:
            out["checkpoint"] = checkpoint_round_trip(ctx, ddp, opt, sched, cfg, micro, total)
        del ddp, opt, sched
    out["depths"] = depths
    out["per_layer"], out["extrapolated_80_layers"] = extrapolate(depths, ctx.device)
    out["tolerance"] = tolerance = ctx.tolerance(1e-2, 1e-5)
    out["ok"] = (
        out["ddp_vs_plain_gradient_gap"] <= tolerance
        and all(d["last_loss"] < d["first_loss"] for d in depths.values())
        and out["checkpoint"]["weights_restored_exactly"]
        and out["checkpoint"]["step_after_resume_gap"] <= tolerance
    )
    return out


def ddp_gradient_gap(ddp, micro: list[dict]) -> float:
    """Two micro-batches accumulated through DDP (the first under no_sync) vs through the bare model."""
    for batch in micro:
        (forward_loss(unwrap(ddp), batch) / len(micro)).backward()
    plain = flat_grads(ddp)
    with ddp.no_sync():
        (forward_loss(ddp, micro[0]) / len(micro)).backward()
    (forward_loss(ddp, micro[1]) / len(micro)).backward()
    return rel(flat_grads(ddp), plain)


def checkpoint_round_trip(ctx: Context, ddp, opt, sched, cfg, micro: list[dict], total: int) -> dict:
    """Save as the trainer does at a report, step on; restore as a resumed worker does, take the same step again."""
    with tempfile.TemporaryDirectory(dir=ctx.workdir) as d:
        saved = flat_weights(ddp)
        state = {"done": [], "job": "slice", "step": sched.last_epoch, "loss_history": []}
        write_checkpoint(
            Path(d),
            ddp,
            trainable_state(ddp),
            get_optimizer_state_dict(ddp, opt, options=FULL),
            sched.state_dict(),
            state,
        )
        optimizer_step(ddp, opt, sched, micro, cfg)
        continued = flat_weights(ddp) - saved
        optim_state, sched_state = restore(unwrap(ddp), Folder(Path(d)))
        exact = bool(torch.equal(flat_weights(ddp), saved))
        opt, sched = fresh_optimizer(ctx, ddp, cfg, total)
        set_optimizer_state_dict(ddp, opt, optim_state, options=FULL)
        sched.load_state_dict(sched_state)
        optimizer_step(ddp, opt, sched, micro, cfg)
        files = {p.name: p.stat().st_size for p in Path(d).iterdir() if p.is_file()}
        return {
            "files_bytes": files,
            "state_step": read_state(Folder(Path(d)), "slice")["step"],
            "weights_restored_exactly": exact,
            "step_after_resume_gap": rel(flat_weights(ddp) - saved, continued),
            "how": "train/outputs.py write_checkpoint / restore / read_state and torch's get/set_optimizer_state_dict, as train/loop.py's train_job calls them",
        }


def extrapolate(depths: dict, device: torch.device) -> tuple[dict, dict]:
    deep, shallow = depths[DEPTHS[0]], depths[DEPTHS[1]]
    span = DEPTHS[0] - DEPTHS[1]
    keys = [k for k in ("parameters", "weights_gib", "peak_memory_gib", "step_s") if deep[k] is not None]
    per_layer = {k: (deep[k] - shallow[k]) / span for k in keys}
    at_80 = {k: deep[k] + (LAYERS_70B - DEPTHS[0]) * per_layer[k] for k in keys}
    at_80["tokens_per_s"] = deep["tokens_per_step"] / at_80["step_s"]
    peak = peak_flops(device)
    at_80["mfu"] = 4 * at_80["parameters"] * at_80["tokens_per_s"] / peak if peak else None
    deep_n, shallow_n = DEPTHS
    at_80["formula"] = (
        f"x(80) = x({deep_n}) + {LAYERS_70B - deep_n} * (x({deep_n}) - x({shallow_n})) / {span}, tokens/s = tokens per step / step_s(80), mfu = 4 x parameters(80) x tokens/s / peak"
    )
    return per_layer, at_80
