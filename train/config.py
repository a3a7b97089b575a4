"""Typed, validated configuration: frozen pydantic models filled from YAML plus `--set` overrides.

Every setting lives in one model (a `Settings`) with a default and a comment; YAML files only
say what differs. Loading rejects an unknown key or a value of the wrong type with a one-line
ConfigError that names the key's full dotted path, so a typo never silently falls back to a
default. Types are strict: an int may stand for a float, nothing else is converted.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


# TrainConfig fields that only pace or place a fine-tune (logging, checkpoint cadence and
# retention, retries, CPUs per worker): they never change what it makes, so no stage's identity
# reads them (jobs/experiment/stages.py).
PACING = ("log_every", "checkpoint_every", "keep_checkpoints", "max_failures", "cpus_per_worker")


class Settings(BaseModel):
    """A section of settings: declared fields only, strict types, frozen. Loaded (`build`) or
    replaced, a wrong value is a one-line ConfigError naming its path; made from keywords, it is
    pydantic's ValidationError (a ValueError too)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def replace(self, **changes) -> typing.Self:
        """A copy with `changes`, checked as loading checks them."""
        return build(type(self), {**dict(self), **changes})


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
    lora_targets: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
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
    mask: Literal["none", "divergence", "random"] = "none"
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
            raise ConfigError(f"pack_length={self.pack_length} is shorter than max_length={self.max_length}: a row of max_length tokens would fit no sequence")
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


def _located(cls: type[BaseModel], loc: tuple) -> tuple[str, type[BaseModel] | None]:
    """(dotted path, the model holding its last key) of a pydantic error location: section and field
    names and mapping keys, without the tags pydantic adds for a union's branches."""
    hint, owner, parts = cls, None, []
    for part in loc:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):  # `part` tags a branch: follow a model, drop the rest
            hint = next((a for a in args if getattr(a, "__name__", None) == part), None)
            continue
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            owner, field = hint, hint.model_fields.get(str(part))
            hint = field.annotation if field else None
        elif origin in (dict, list):
            hint = args[-1]
        else:
            hint = None
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip("."), owner


def config_problem(cls: type[BaseModel], err: ValidationError, prefix: str = "") -> str:
    """One line naming the first key that is wrong, and how."""
    errors = err.errors()
    path, owner = _located(cls, errors[0]["loc"])
    same = [e for e in errors if _located(cls, e["loc"])[0] == path]
    key = ".".join(p for p in (prefix, path) if p)
    first = same[0]
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key} (known: {', '.join(sorted(owner.model_fields))})"
    if first["type"] == "value_error":  # a model's own check: its message says what is wrong
        return f"{key + ': ' if key else ''}{first['msg'].removeprefix('Value error, ')}"
    if first["type"] == "missing":
        return f"{key}: required, not given"
    wants = " or ".join(dict.fromkeys(_wanted(e) for e in same))  # each branch of a union once
    return f"{key}: expected {wants}, got {type(first['input']).__name__} {first['input']!r}"


def _wanted(error: dict) -> str:
    """What one pydantic error says the value should be: "a valid integer", "'ddp' or 'fsdp'", "a mapping"."""
    return "a mapping" if error["type"] in ("model_type", "dict_type") else error["msg"].removeprefix("Input should be ")


def build(cls: type[BaseModel], data: dict | None, prefix: str = "") -> Any:
    """Model `cls` from a plain dict, every name and type checked; a ConfigError names the first wrong key."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(config_problem(cls, err, prefix)) from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=value` overrides (value parsed as YAML) to a nested dict, returning a copy."""
    data = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {path}: {key} is not a section")
        try:
            node[keys[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({yaml_problem(err)})") from None
    return data


def yaml_problem(err: yaml.YAMLError) -> str:
    """What a YAML parser found wrong, and where, in one line: "found unexpected end of stream at line 3, column 1"."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(err, 'problem', None) or err}{where}"


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


MAX_EXTENDS = 8  # a chain of `extends` longer than this is a loop or a mistake


def load_layered(first: Path, find=None) -> tuple[dict, list[Path]]:
    """A YAML file's settings with every file it `extends` merged under it (mappings key by key,
    anything else replaced whole), and the chain of files, the root first. `find(value, folder)`
    turns an `extends` value into a file; by default a path relative to the extending file's folder."""
    find = find or (lambda value, folder: folder / Path(value).expanduser())
    chain, layers = [Path(first)], []
    while True:
        data = load_yaml(chain[-1])
        parent = data.pop("extends", None)
        layers.append(data)
        if parent is None:
            break
        if not isinstance(parent, str):
            raise ConfigError(f"{chain[-1]}: extends must name one preset file, got {parent!r}")
        path = find(parent, chain[-1].parent)
        if path in chain:
            raise ConfigError(f"{chain[-1]}: extends {parent} makes a loop ({' -> '.join(p.name for p in [*chain, path])})")
        if len(chain) >= MAX_EXTENDS:
            raise ConfigError(f"{chain[0]}: extends more than {MAX_EXTENDS} presets deep")
        chain.append(path)
    merged: dict = {}
    for layer in reversed(layers):
        merged = deep_merge(merged, layer)
    return merged, list(reversed(chain))


def deep_merge(base: dict, child: dict) -> dict:
    """`child` over `base`: mappings merged key by key, anything else replaced whole."""
    out = dict(base)
    for key, value in child.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(cls: type[BaseModel], path: str | Path | None = None, overrides: list[str] = (), section: str | None = None) -> Any:
    """Load settings model `cls` from a YAML file (optionally one top-level section of it) plus overrides."""
    data = load_yaml(path) if path else {}
    if section is not None:
        data = data.get(section) or {}
    return build(cls, apply_overrides(data, list(overrides)), section or "")


def to_dict(cfg: BaseModel) -> dict:
    """A plain, YAML/JSON-serialisable dict of a settings model."""
    return cfg.model_dump()
