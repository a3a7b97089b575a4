"""Settings of one fine-tune: `TrainConfig` (a frozen settings model, common/config.py) and how its
batch resolves for a number of workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import ConfigError, Settings
from train.axes import MASKS

# TrainConfig fields that only pace or place a fine-tune (logging, checkpoint cadence and
# retention, retries, CPUs per worker): they never change what it makes, so no stage's identity
# reads them (jobs/experiment/stages.py).
PACING = ("log_every", "checkpoint_every", "keep_checkpoints", "max_failures", "cpus_per_worker")


class TrainConfig(Settings):
    """Settings of one fine-tune (teacher, student or control): LoRA, or every weight."""

    # lora: an adapter over the frozen base, the paper's setup. full: every weight trains
    # in float32 (bf16 compute on GPU), the critics' control (transfer is said to vanish
    # without LoRA); the result is a model folder of its own, served as its own base.
    method: Literal["lora", "full"] = "lora"

    # LoRA. One init seed for every adapter of an experiment: subliminal transfer
    # needs teacher and students to start from the same adapter weights.
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    lora_seed: int = 0

    # Optimisation. batch_size is rows per worker per micro-step. global_batch_size,
    # when set, is rows per optimizer step over all workers: grad_accum then follows
    # from the worker count (resolve_batch), so a step means the same on 1 or 8 workers.
    lr: float = 2e-3
    weight_decay: float = 0.0
    # adamw, or sgd with momentum: transfer is claimed to need an adaptive optimizer,
    # and an sgd arm tests that claim (at its own lr: SGD wants a larger one).
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: float = 0.9  # sgd only
    warmup_ratio: float = 0.05
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float = 1.0
    batch_size: int = 16
    grad_accum: int = 1
    global_batch_size: int | None = None
    epochs: int = 1
    max_steps: int | None = None  # optimizer steps; caps epochs when set
    seed: int = 0  # data order

    # Data. Rows are packed into sequences of at most max_length tokens (no
    # attention across rows). Rows longer than max_length lose prompt tokens from
    # the left ("truncate") or are skipped ("drop"); either way the count is reported.
    max_length: int = 256
    too_long: Literal["truncate", "drop"] = "truncate"
    # Tokens dropped from the loss (train/divergence.py): `divergence` drops a row's mask_fraction
    # of completion tokens where the teacher diverges most from its base (the job names the
    # teacher), `random` as many chosen at random (its control). SFT only.
    mask: Literal[tuple(MASKS)] = "none"  # train/axes.py: what each needs
    mask_fraction: float = 0.1

    # Distribution and precision.
    num_workers: int | Literal["auto"] = 2  # auto: one per GPU of the cluster (train/cluster.py auto_workers)
    use_gpu: bool = False
    strategy: Literal["ddp", "fsdp"] = "ddp"
    quantization: Literal["none", "4bit", "8bit"] = "none"  # bitsandbytes, GPU only
    gradient_checkpointing: bool = False
    # CPUs each worker reserves. None: this run's workers share all CPUs but one (left
    # to Ray Data). Set it when several runs share a cluster at once, so that all
    # their workers together still leave Ray Data a CPU.
    cpus_per_worker: float | None = None
    attention: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    # Throughput levers (the same optimisation, faster; BENCHMARKS.md measures each on a GPU).
    # pack_length: tokens per packed sequence (None: max_length). Rows are still cut at max_length; a
    # longer pack_length packs a micro-step's rows into fewer, longer sequences, with less padding.
    pack_length: int | None = Field(None, gt=0)
    # liger: Liger's Triton kernels for the norms, SwiGLU and rotary embedding, and a cross-entropy
    # fused with the lm_head that never holds the logits (Llama models on CUDA; elsewhere the plain
    # path runs, and the worker's log says why).
    kernels: Literal["none", "liger"] = "none"
    compile: bool = False  # torch.compile of the model each job trains (its first steps pay the compile)

    # Observability and fault tolerance (with cpus_per_worker: PACING, above).
    log_every: int = 5  # steps between progress lines and Ray metrics (ray.train.report: with each checkpoint)
    checkpoint_every: int = 50  # steps between checkpoints (and one at the end)
    keep_checkpoints: int = 2
    max_failures: int = 2
    # Adapter copies at this many evenly spaced optimizer steps (the last one is the
    # final step), in <output_dir>/snapshots/step-<k>/; 0 keeps none.
    snapshots: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0 < self.mask_fraction < 1:
            raise ConfigError(f"mask_fraction must be in (0, 1), got {self.mask_fraction}")
        if self.pack_length is not None and self.pack_length < self.max_length:
            raise ConfigError(
                f"pack_length={self.pack_length} is shorter than max_length={self.max_length}: a row of max_length tokens would fit no sequence"
            )
        if self.method == "full" and self.quantization != "none":
            raise ConfigError(
                f"method=full with quantization={self.quantization} is refused: full fine-tuning updates every "
                "weight, and 4/8-bit weights cannot be trained in place; use quantization=none (and strategy=fsdp "
                "to shard weights, gradients and optimizer state over the GPUs)"
            )
        if self.strategy == "fsdp" and self.quantization != "none":
            raise ConfigError(
                f"strategy=fsdp with quantization={self.quantization} is refused: FSDP2 turns bitsandbytes' packed "
                "4/8-bit weights into plain parameters (wrong outputs and crashes are reported for it); use "
                "strategy=ddp with the quantized base on every GPU (a 70B 4-bit base fits an 80 GB GPU: "
                "python -m jobs.sizing.memory_plan), or quantization=none with fsdp"
            )
        return self


def resolve_batch(cfg: TrainConfig, num_workers: int) -> TrainConfig:
    """`cfg` for `num_workers` workers: num_workers filled in and, with global_batch_size, grad_accum.

    grad_accum = global_batch_size / (num_workers x batch_size), which must divide
    exactly. Giving both global_batch_size and a grad_accum is an error, except
    the grad_accum this function derived itself, so resolving twice (placement up
    front, then the trainer) is harmless.
    """
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ConfigError(f"num_workers: expected a positive number of workers, got {num_workers!r}")
    if cfg.batch_size < 1 or cfg.grad_accum < 1:
        raise ConfigError(f"batch_size={cfg.batch_size} and grad_accum={cfg.grad_accum} must be at least 1")
    if cfg.global_batch_size is None:
        return cfg.replace(num_workers=num_workers)
    per_micro = num_workers * cfg.batch_size
    accum, rest = divmod(cfg.global_batch_size, per_micro)
    if rest or accum < 1:
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} is not a multiple of num_workers={num_workers}"
            f" x batch_size={cfg.batch_size} (= {per_micro} rows per micro-step)"
        )
    if cfg.grad_accum not in (1, accum):
        raise ConfigError(
            f"set global_batch_size or grad_accum, not both: global_batch_size={cfg.global_batch_size} with"
            f" num_workers={num_workers} x batch_size={cfg.batch_size} means grad_accum={accum}, not {cfg.grad_accum}"
        )
    return cfg.replace(num_workers=num_workers, grad_accum=accum)
