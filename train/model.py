"""Model setup for training: load the base, attach (and later remove) a LoRA adapter, shard or replicate.

Loading the base and attaching a LoRA adapter are separate steps, so a worker
that trains several adapters loads the base once (train/loop.py). Under
`method: full` the loaded base itself is what trains: every weight in float32,
saved as a model folder (weights, config and tokenizer) rather than an adapter.
The other choices are made here, once, from the config and the hardware:
attention implementation (flash-attn 2 when installed on CUDA, else SDPA), bf16
+ TF32 on GPU and float32 on CPU, optional 4/8-bit base through bitsandbytes
(GPU only, LoRA only), non-reentrant gradient checkpointing, and DDP or FSDP2.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from pathlib import Path

import torch

from common.config import ConfigError
from common.model_source import load_pretrained
from train.config import TrainConfig
from train.levers import decoder_layers, use_kernels


def check_model_path(model_path: str) -> None:
    """A clear error (FileNotFoundError naming the path) for a base model that is not there.

    The same rule as the inference service and pre-staging (`common.model_source`):
    a folder holding config.json, or a hub id (`name` or `org/name`), which passes.
    """
    from common.model_source import model_source

    model_source(model_path, what="base model")


def check_hardware(cfg: TrainConfig, cuda_available: bool) -> None:
    """Settings that cannot work on this hardware fail before any work starts."""
    if cfg.quantization != "none" and not (cfg.use_gpu and cuda_available):
        raise ConfigError(
            f"quantization={cfg.quantization} needs a CUDA GPU (bitsandbytes); set quantization=none on CPU"
        )
    if cfg.attention == "flash_attention_2" and not (cfg.use_gpu and cuda_available):
        raise ConfigError("attention=flash_attention_2 needs a CUDA GPU")


def attention_impl(cfg: TrainConfig, device: torch.device) -> str:
    if cfg.attention != "auto":
        return cfg.attention
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def packs_into_one_row(attention: str) -> bool:
    """Whether packed micro-batches must be one row under this attention implementation (attention_impl,
    or a loaded model's `config._attn_implementation`): flash attention reads restarting position
    ids as example boundaries only at batch size 1; with several rows it would attend across the
    examples packed into each row, silently."""
    return "flash" in str(attention)


def compute_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def autocast_for(device: torch.device):
    """bf16 autocast on GPU (a bf16 base under float32 adapters); nothing on CPU, where all is float32."""
    return torch.autocast("cuda", dtype=compute_dtype(device)) if device.type == "cuda" else contextlib.nullcontext()


def load_base(model_path: str, cfg: TrainConfig, device: torch.device):
    """The base model on `device` (quantization, checkpointing, no KV cache): frozen, ready for
    adapters, or under `method: full` every weight trainable, in float32 (the optimizer's master
    copy; on GPU the forward runs in bf16 under autocast).

    Only the settings a worker group shares are read (method, quantization, attention,
    gradient_checkpointing), so one base serves every adapter of a many-run.
    """
    from transformers import AutoModelForCausalLM

    full = cfg.method == "full"
    dtype = torch.float32 if full else compute_dtype(device)
    kwargs: dict = {"dtype": dtype, "attn_implementation": attention_impl(cfg, device)}
    if cfg.quantization != "none":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=cfg.quantization == "4bit",
            load_in_8bit=cfg.quantization == "8bit",
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_quant_storage=dtype,  # FSDP shards 4-bit weights only if storage matches compute dtype
        )
        kwargs["device_map"] = {"": device}
    model = load_pretrained(AutoModelForCausalLM, model_path, **kwargs)
    model.config.use_cache = False
    if cfg.kernels != "none":  # before any adapter wraps the modules it patches
        print(f"[train] {use_kernels(model, cfg, device)}", flush=True)
    if cfg.quantization != "none":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for p in model.parameters():
        p.requires_grad_(full)
    return model if cfg.quantization != "none" else model.to(device)  # a bitsandbytes model is placed by device_map


def attach_lora(base, cfg: TrainConfig):
    """Wrap `base` in a PeftModel with a fresh LoRA adapter, initialised from cfg.lora_seed alone.

    The init depends on the seed, rank, alpha, targets and base, never on what ran
    before in the process, so an adapter attached to a base that already carried
    (and dropped) others starts bit-identical to one attached to a fresh base.
    """
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_targets,
        task_type="CAUSAL_LM",
    )
    device = next(base.parameters()).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.lora_seed)  # the same adapter init for teacher and students
        model = get_peft_model(base, lora)
    for p in model.parameters():  # adapters train in float32 even over a bf16 base
        if p.requires_grad:
            p.data = p.data.float()
    return model.to(device)


def freeze_a_at(model, adapter_dir: str) -> None:
    """`lora_init: teacher_a`: set every LoRA A of the student's adapter to the given adapter's
    trained A and freeze it, so only B trains (from zero). The adapters must match in targets and rank."""
    from safetensors.torch import load_file

    trained = {
        _module_key(n): w
        for n, w in load_file(str(Path(adapter_dir) / "adapter_model.safetensors")).items()
        if "lora_A" in n
    }
    mine = {n: p for n, p in unwrap(model).named_parameters() if "lora_A" in n and ".default." in n}
    if {_module_key(n) for n in mine} != set(trained):
        raise ValueError(f"lora_init teacher_a: the adapter in {adapter_dir} has other LoRA modules than the student's")
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_(trained[_module_key(name)].to(p.dtype))
            p.requires_grad_(False)


def _module_key(name: str) -> str:
    """A LoRA weight's name without PEFT's adapter-name part (`...lora_A.default.weight` -> `...lora_A.weight`)."""
    return name.replace(".default.", ".")


def trained_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """The weights a job trains and saves, in name order: the adapter's (the trainable ones, and LoRA
    weights frozen at an init of their own, `freeze_a_at`, which the saved adapter must still hold),
    or every weight of a fully fine-tuned model."""
    params = [
        (n, p) for n, p in unwrap(model).named_parameters() if p.requires_grad or ("lora_" in n and ".default." in n)
    ]
    return sorted(params, key=lambda item: item[0])


def detach_lora(model):
    """Remove the adapter's layers without merging them; returns the untouched base for the next adapter."""
    base = model.unload()
    # PEFT hooks the input embeddings for gradient checkpointing on attach (not on a quantized
    # base, whose hook prepare_model_for_kbit_training set once): drop it, the next attach adds its own.
    quantized = (
        getattr(base, "is_loaded_in_4bit", False)
        or getattr(base, "is_loaded_in_8bit", False)
        or getattr(base, "is_quantized", False)
    )
    if not quantized and getattr(base, "_require_grads_hooks", None):
        base.disable_input_require_grads()
    return base


def load_lora_model(model_path: str, cfg: TrainConfig, device: torch.device):
    """The base model with a freshly initialised LoRA adapter (seeded by cfg.lora_seed)."""
    return attach_lora(load_base(model_path, cfg, device), cfg)


def adapter_hash(model) -> str:
    """Fingerprint of the adapter's weights: sha256 over names and float32 bytes in name order, 16 hex chars.

    Taken right after attach_lora, it records which init an adapter started from:
    equal for equal lora_seed, rank, alpha, targets and base.
    """
    import hashlib

    h = hashlib.sha256()
    for name, p in trained_parameters(model):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def wrap_distributed(model, cfg: TrainConfig, device: torch.device, ddp_alone: bool = False):
    """Replicate (DDP) or shard (FSDP2 over each decoder layer, then the root). A lone DDP worker
    trains its model bare, unless `ddp_alone` asks for the wrapper a larger group would get
    (bench/gpu_check.py builds DDP so on one GPU). DDP does not broadcast buffers before each
    forward: every worker loads the same base and nothing trained here changes a buffer, and the
    broadcast was a collective per micro-step, a wait for the slower worker (about a tenth of a
    step on two CPU workers: BENCHMARKS.md, "The pipeline's overhead")."""
    import torch.distributed as dist

    if not dist.is_initialized() or (dist.get_world_size() == 1 and cfg.strategy == "ddp" and not ddp_alone):
        return model
    if cfg.strategy == "ddp":
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        # torch 2.13 renamed the switch (the old name warns in every worker); the lent GPUs' torch 2.11 has
        # only the old one. The new one still syncs buffers once at the start: equal on every worker anyway.
        new_name = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        no_sync = {"forward_sync_buffers" if new_name else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=compute_dtype(device), reduce_dtype=torch.float32)
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"FSDP: found no decoder layers (_no_split_modules) to shard in {type(model).__name__}")
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def unwrap(model):
    """The model inside a DDP wrapper (FSDP2 shards in place and needs no unwrapping)."""
    return model.module if hasattr(model, "module") else model


def is_adapter_model(model) -> bool:
    """Whether `model` (or the model a DDP wrapper holds) is a PeftModel, not a fully fine-tuned one."""
    return hasattr(unwrap(model), "peft_config")


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Full (gathered) tensors of the trained weights (`trained_parameters`); collective under FSDP."""
    from torch.distributed.tensor import DTensor

    state = {}
    for name, p in trained_parameters(model):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        state[name] = full.detach().to("cpu", torch.float32).clone()
    return state


def save_trained(model, state: dict[str, torch.Tensor], out_dir: Path) -> None:
    """Write what a job made from its gathered weights: a PEFT adapter folder (adapter_config.json +
    safetensors), or for a fully fine-tuned model a model folder that loads and serves on its own
    (config, float32 safetensors and the base's tokenizer)."""
    model = unwrap(model)
    if is_adapter_model(model):
        # not a distillation teacher
        model.save_pretrained(str(out_dir), state_dict=state, selected_adapters=["default"])
        return
    from transformers import AutoTokenizer

    model.save_pretrained(str(out_dir), state_dict=state)
    load_pretrained(AutoTokenizer, model.name_or_path).save_pretrained(str(out_dir))


def logical_numel(param) -> int:
    """Weights a parameter stands for. A bitsandbytes 4-bit parameter stores its values packed
    (two per byte, in its quant_storage dtype: a quarter of the elements in bf16 storage), so its
    numel undercounts; its quant_state keeps the real shape."""
    shape = getattr(getattr(param, "quant_state", None), "shape", None)
    return math.prod(shape) if shape is not None else param.numel()


def count_parameters(model) -> tuple[int, int]:
    """(all parameters, trainable parameters), 4-bit weights counted unpacked (MFU reads them);
    call before sharding."""
    params = list(unwrap(model).parameters())
    return sum(logical_numel(p) for p in params), sum(p.numel() for p in params if p.requires_grad)
