"""The experiment's configuration: one frozen dataclass tree, loaded from a YAML preset.

`configs/tiny.yaml` is the default preset (a 2-core CPU); larger presets target
GPU clusters. Every key is documented here, once; a preset only states what
differs from these defaults, and `--set a.b=value` overrides any key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from train.config import ConfigError, TrainConfig, apply_overrides, build, load_yaml

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny.yaml"


@dataclass(frozen=True)
class ModelConfig:
    # "tiny" builds the tiny preset's model into the cache; anything else is a
    # hub id or a local folder saved with save_pretrained.
    path: str = "tiny"
    tiny_seed: int = 0


@dataclass(frozen=True)
class DataConfig:
    # "synthetic" (the shipped harmless sample), "hub" (cais/wmdp), or a folder
    # holding wmdp-<subset>.jsonl / .parquet files.
    source: str = "synthetic"
    subsets: list[str] = field(default_factory=lambda: ["bio", "chem", "cyber"])
    eval_fraction: float = 0.3  # share of questions held out from the teacher
    split_seed: int = 0


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "tiny"
    cache_dir: str | None = None  # default: $SUBLIMINAL_CACHE or ~/.cache/subliminal-ray
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    teacher: TrainConfig = field(default_factory=TrainConfig)
    student: TrainConfig = field(default_factory=TrainConfig)


def load_experiment(path: str | Path | None = None, overrides: list[str] = ()) -> ExperimentConfig:
    """Load a preset (default: tiny) plus overrides; unknown keys and wrong types name the key."""
    data = apply_overrides(load_yaml(path or DEFAULT_CONFIG), list(overrides))
    cfg = build(ExperimentConfig, data)
    if cfg.teacher.lora_seed != cfg.student.lora_seed:
        raise ConfigError(
            f"teacher.lora_seed ({cfg.teacher.lora_seed}) must equal student.lora_seed ({cfg.student.lora_seed}):"
            " students must start from the teacher's LoRA initialisation"
        )
    if not 0 < cfg.data.eval_fraction < 1:
        raise ConfigError(f"data.eval_fraction must be in (0, 1), got {cfg.data.eval_fraction}")
    return cfg


def as_dict(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg)
