"""Memory arithmetic for a preset: per-GPU memory of its training stages and of its engine replicas.

    python -m jobs.sizing.memory_plan --config configs/llama-70b-qlora.yaml [--gpu-gib 80] [--gpus 8]
    python -m jobs.sizing.memory_plan --config configs/llama-8b.yaml --model-config path/to/config.json [--set teacher.batch_size=16]

Estimates from the model's shape (its `config.json`; the presets' hub models
have their shapes in jobs/sizing/shape.py, so no download is needed), to adapt a preset to other
GPUs before renting them. docs/scaling.md explains each term. What is estimated:

- training, per GPU: base weights (bf16 2 bytes/parameter, 8-bit 1, 4-bit NF4
  with double quantisation about 0.52; bitsandbytes leaves the embeddings,
  lm_head and norms unquantized, and PEFT's prepare_model_for_kbit_training
  upcasts those to float32, 4 bytes), divided by the workers under FSDP (bf16
  only: FSDP over a quantized base is refused); LoRA weights, gradients
  and optimizer state in float32 (16 bytes per LoRA parameter under AdamW's two
  moments, 12 under SGD's one momentum buffer), also sharded under
  FSDP; activations: what autograd saves per token (shape.py) times the tokens of
  one micro-step (batch_size x max_length, packing's upper bound), plus the
  weight copies it saves; a fixed allowance for the CUDA context, NCCL buffers
  and allocator slack. And the load peak: each worker loads the whole base onto
  its GPU before FSDP shards it.
- full fine-tuning (`method: full`), per GPU: float32 weights, float32 gradients
  and the optimizer's float32 state (8 bytes a parameter under AdamW, 4 under
  SGD), all divided by the workers under FSDP; the bf16 copies the forward
  computes with (under DDP autocast keeps one of every weight until backward;
  FSDP gathers about two layers at a time); DDP's gradient buckets, another
  float32 copy of the gradients; activations as in shape.py. A stage that does not fit
  is refused (exit 1) with what would: FSDP, more GPUs.
- engine, per GPU of a replica: bf16 weights / tensor_parallel_size, then the
  KV cache gets what `gpu_memory_utilization` leaves after weights and an
  activation/CUDA-graph allowance; shown as the tokens of KV cache that fit.

The model's shape and the activation terms per token, each read off a library's code path, are in
jobs/sizing/shape.py; this module adds them up per stage and prints the plan.
"""

from __future__ import annotations

import argparse
import sys

from common.cli import program
from common.config import ConfigError
from jobs.sizing.shape import Precision, Shape, load_shape

GIB = 1 << 30
FIXED_OVERHEAD_GIB = 2.5  # CUDA context, NCCL buffers, allocator fragmentation (per process)
ENGINE_RESERVE_GIB = 4.0  # vLLM's activation peak at its batch limit plus CUDA graphs
BYTES_PER_PARAM = {"none": 2.0, "8bit": 1.0, "4bit": 0.5 + 0.127 / 8}  # NF4 + double-quantised scales
# float32 state per trainable parameter: two moments, or one momentum buffer
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4}


def activation_bytes_per_token(shape: Shape, train) -> float:
    """Peak activation bytes per token of one training stage (a TrainConfig), on its device."""
    sequence = train.pack_length or train.max_length  # the longest packed sequence: SDPA's mask spans it
    return shape.activation_bytes_per_token(Precision.of(train, train.use_gpu), sequence, train.gradient_checkpointing)


def full_training_gib(shape: Shape, train, workers: int) -> dict[str, float]:
    """Per-GPU memory of one full fine-tuning stage (see the module docstring)."""
    fsdp = train.strategy == "fsdp"
    shard = workers if fsdp else 1
    params = shape.params()
    layer = (shape.linear_params() + 2 * shape.hidden * shape.layers) / shape.layers
    bf16_copies = 2 * layer * 2 if fsdp else params * 2
    tokens = train.batch_size * train.max_length
    parts = {
        "weights": params * 4 / shard / GIB,
        "gradients": params * 4 / shard / GIB,
        "optimizer": params * OPTIMIZER_STATE_BYTES[train.optimizer] / shard / GIB,
        "bf16 copies": bf16_copies / GIB,
        "ddp buckets": 0.0 if fsdp else params * 4 / GIB,
        "activations": tokens * activation_bytes_per_token(shape, train) / GIB,
        "fixed": FIXED_OVERHEAD_GIB,
    }
    # Each worker loads the whole float32 model onto its GPU before FSDP shards it (train/model.py).
    return {**parts, "total": sum(parts.values()), "load peak": params * 4 / GIB + FIXED_OVERHEAD_GIB}


def training_gib(shape: Shape, train, workers: int) -> dict[str, float]:
    """Per-GPU memory of one training stage (a TrainConfig with a resolved worker count)."""
    if train.method == "full":
        return full_training_gib(shape, train, workers)
    shard = workers if train.strategy == "fsdp" else 1
    # embeddings, lm_head, norms: upcast to float32 under k-bit training
    unquantized = 4 if train.quantization != "none" else 2
    full_weights = (
        shape.linear_params() * BYTES_PER_PARAM[train.quantization]
        + (shape.params() - shape.linear_params()) * unquantized
    ) / GIB
    lora = shape.lora_params(train.lora_rank, train.lora_targets) * (8 + OPTIMIZER_STATE_BYTES[train.optimizer]) / shard
    tokens = train.batch_size * train.max_length
    p = Precision.of(train, train.use_gpu)
    copies = shape.weight_copies(p)
    dequantized = max(a * b for a, b in shape.projections().values()) * p.compute if p.quantized else 0  # one at a time
    layers = 1 if train.gradient_checkpointing else shape.layers  # a checkpointed layer's copies live in its recompute
    parts = {
        "weights": full_weights / shard,
        "lora + optimizer": lora / GIB,
        "activations": tokens * activation_bytes_per_token(shape, train) / GIB,
        "weight copies": (layers * copies["layer"] + copies["lm_head"] + dequantized) / GIB,
        "fixed": FIXED_OVERHEAD_GIB,
    }
    # Each worker loads the whole base onto its GPU before FSDP shards it (train/model.py).
    return {**parts, "total": sum(parts.values()), "load peak": full_weights + FIXED_OVERHEAD_GIB}


def engine_gib(shape: Shape, tensor_parallel: int, gpu_gib: float, utilization: float) -> dict[str, float]:
    """Per-GPU memory of one vLLM replica and the KV-cache tokens it leaves room for."""
    weights = shape.params() * 2 / tensor_parallel / GIB
    kv_budget = gpu_gib * utilization - weights - ENGINE_RESERVE_GIB
    kv_per_token = shape.kv_bytes_per_token() / tensor_parallel
    return {
        "weights": weights,
        "reserve": ENGINE_RESERVE_GIB,
        "kv cache": max(kv_budget, 0.0),
        "kv tokens": max(kv_budget, 0.0) * GIB / kv_per_token,
    }


def fits(parts: dict[str, float], gpu_gib: float) -> bool:
    return max(parts["total"], parts["load peak"]) <= gpu_gib


def fit_advice(shape: Shape, train, workers: int, gpu_gib: float) -> str:
    """What would make a stage that does not fit on `workers` GPUs of `gpu_gib` fit: FSDP over the
    same GPUs, or the fewest GPUs (up to 64) that would under FSDP; else why neither does."""
    if train.quantization != "none":
        return "FSDP over a quantized base is refused (train/config.py); fewer tokens per micro-step, or a larger GPU"
    sharded = train.replace(strategy="fsdp")
    for n in [workers] + [n for n in (2, 4, 8, 16, 32, 64) if n > workers]:
        parts = training_gib(shape, sharded, n)
        if fits(parts, gpu_gib):
            where = f"strategy: fsdp over the {n} GPU(s)" if n == workers else f"{n} GPUs under strategy: fsdp"
            return f"{where} ({parts['total']:.1f} GiB each)"
    return f"no GPU count does: each worker loads the whole model ({parts['load peak']:.0f} GiB) before FSDP shards it; a larger GPU, or LoRA"


def stage_plans(cfg) -> dict[str, object]:
    """The training configs a preset runs: the teacher's, and each arm's (its first replicate's)."""
    from jobs.experiment.arms import arm_models

    plans = {"teacher": cfg.teacher}
    for m in arm_models(cfg):
        plans.setdefault(f"arms.{m.arm}", m.train)
    return plans


def main(argv: list[str] | None = None) -> int:
    from jobs.experiment.config import load_experiment

    parser = argparse.ArgumentParser(
        prog=program("python -m jobs.sizing.memory_plan"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="a preset's path or a shipped preset's name")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU (H100: 80)")
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs that `num_workers: auto` stands for (as jobs.sizing.wall_time)"
    )
    parser.add_argument(
        "--model-config", default=None, help="the model's config.json (default: its folder, or a known hub id)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_experiment(args.config, args.overrides)
        shape = load_shape(cfg.model.path, args.model_config)
    except (ConfigError, OSError, ValueError) as err:  # a config.json that is missing or not JSON
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"{cfg.model.path}: {shape.params() / 1e9:.2f}B parameters, KV cache {shape.kv_bytes_per_token() / 1024:.0f} KiB/token"
    )
    refused = []
    for name, train in stage_plans(cfg).items():
        workers = args.gpus if train.num_workers == "auto" else train.num_workers
        parts = training_gib(shape, train, workers)
        detail = ", ".join(f"{k} {v:.1f}" for k, v in parts.items() if k not in ("total", "load peak"))
        lora = shape.lora_params(train.lora_rank, train.lora_targets)
        what = f"full fine-tuning {shape.params() / 1e9:.1f}B" if train.method == "full" else f"LoRA {lora / 1e6:.0f}M"
        verdict = f"fits in {args.gpu_gib:g}"
        if not fits(parts, args.gpu_gib):
            verdict = f"DOES NOT FIT in {args.gpu_gib:g}; would fit: {fit_advice(shape, train, workers, args.gpu_gib)}"
            refused.append(name)
        print(
            f"{name}: {workers} x {train.strategy}, {train.quantization}, {what} params,"
            f" {train.batch_size * train.max_length} tokens/micro-step: {parts['total']:.1f} GiB per GPU ({detail});"
            f" {parts['load peak']:.1f} while loading: {verdict}"
        )
    engine = engine_gib(shape, cfg.service.tensor_parallel_size, args.gpu_gib, cfg.service.gpu_memory_utilization)
    print(
        f"engine: tensor-parallel {cfg.service.tensor_parallel_size}, per GPU weights {engine['weights']:.1f} GiB,"
        f" reserve {engine['reserve']:.1f}, KV cache {engine['kv cache']:.1f} GiB = {engine['kv tokens']:,.0f} tokens per replica"
    )
    if refused:
        print(
            f"error: refused, {' and '.join(refused)} would not fit {args.gpus} GPU(s) of {args.gpu_gib:g} GiB (see above)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
