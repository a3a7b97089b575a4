"""Arms x replicates: the student-like models an experiment trains, resolved from the preset.

A preset declares arms (jobs/config.py `ArmConfig`): which numbers an arm trains
on, where its LoRA starts, which loss it minimises, and any `student` keys that
differ. `replicates: k` trains each arm k times. This module turns that
declaration into one `ArmModel` per (arm, replicate), with every seed and
setting resolved, and refuses declarations that cannot mean what they say:

- an arm that claims the teacher's LoRA init (no `lora_seed`, or the teacher's
  seed) must have the teacher's rank, alpha, target modules and quantization,
  or its "same init" would be false;
- a contrast needs declared arms with enough replicates (`check_contrasts`).

Names: the model `<arm>/<i>` in files and logs (`student/0`), the adapter
`<arm>-<i>` in the inference service and as a training job (those names cannot hold
"/" or "."; arm names hold no "-", so the name is unambiguous).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from train.config import ConfigError, TrainConfig, build

ARM_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,40}$")
RESERVED = {"base", "teacher"}
SAME_INIT_KEYS = ("lora_rank", "lora_alpha", "lora_targets", "quantization")
MIN_CONTRAST_REPLICATES = 3


@dataclass(frozen=True)
class ArmModel:
    arm: str
    replicate: int
    source: str  # whose kept numbers it reads: "teacher" or "base"
    shuffled: bool
    loss: str
    train: TrainConfig  # resolved: data-order seed and LoRA seed set for this replicate
    same_init: bool  # starts from the teacher's LoRA initialisation

    @property
    def name(self) -> str:
        return f"{self.arm}/{self.replicate}"

    @property
    def adapter(self) -> str:
        return f"{self.arm}-{self.replicate}"


def numbers_seed(cfg, replicate: int) -> int:
    """Replicate i samples (and draws its prompts) with seed numbers.seed + i."""
    return cfg.numbers.seed + replicate


def _lora_seed(declared, teacher_seed: int, replicate: int) -> int:
    if declared is None:
        return teacher_seed
    if declared == "other":
        return teacher_seed + 1 + replicate  # its own per replicate, never the teacher's
    return declared


def _check_same_init(name: str, train: TrainConfig, teacher: TrainConfig) -> None:
    for key in SAME_INIT_KEYS:
        if getattr(train, key) != getattr(teacher, key):
            raise ConfigError(
                f"arms.{name} starts from the teacher's LoRA init (lora_seed {teacher.lora_seed}) but its {key} "
                f"{getattr(train, key)!r} differs from the teacher's {getattr(teacher, key)!r}; "
                "match it, or give the arm another lora_seed (an int or 'other')"
            )


def arm_models(cfg) -> list[ArmModel]:
    """Every (arm, replicate) of the experiment, in a stable order; ConfigError for a bad declaration."""
    if not cfg.arms:
        raise ConfigError("arms: declare at least one arm (e.g. student: {numbers: teacher})")
    teacher = cfg.teacher
    if cfg.student.lora_seed != teacher.lora_seed:
        raise ConfigError(
            f"student.lora_seed ({cfg.student.lora_seed}) differs from teacher.lora_seed ({teacher.lora_seed}): "
            "arms start from the teacher's init; give an arm another one with arms.<name>.lora_seed"
        )
    models = []
    for name, arm in cfg.arms.items():
        if not ARM_NAME.match(name) or name in RESERVED:
            raise ConfigError(f"arms.{name}: an arm name is lower-case letters, digits or '_', and not base or teacher")
        if "lora_seed" in arm.train:
            raise ConfigError(f"arms.{name}.train.lora_seed: set the arm's init with arms.{name}.lora_seed")
        base = build(TrainConfig, {**dataclasses.asdict(cfg.student), **arm.train}, f"arms.{name}.train")
        if arm.replicates is not None and arm.replicates < 1:
            raise ConfigError(f"arms.{name}.replicates must be at least 1, got {arm.replicates}")
        if arm.against not in ("auto", "base", *cfg.arms) or arm.against == name:
            raise ConfigError(f"arms.{name}.against={arm.against!r}: use auto, base or another arm's name")
        for i in range(arm.replicates or cfg.replicates):
            lora_seed = _lora_seed(arm.lora_seed, teacher.lora_seed, i)
            same_init = lora_seed == teacher.lora_seed
            if same_init:
                _check_same_init(name, base, teacher)
            train = dataclasses.replace(base, lora_seed=lora_seed, seed=base.seed + i)
            models.append(ArmModel(name, i, arm.numbers.replace("_shuffled", ""), arm.numbers.endswith("_shuffled"), arm.loss, train, same_init))
    return models


def check_contrasts(cfg) -> None:
    """Each contrast names two declared arms with at least MIN_CONTRAST_REPLICATES replicates each."""
    for name, contrast in cfg.contrasts.items():
        for side in (contrast.arm, contrast.against):
            if side not in cfg.arms:
                raise ConfigError(f"contrasts.{name}: {side!r} is not a declared arm ({', '.join(cfg.arms)})")
            count = cfg.arms[side].replicates or cfg.replicates
            if count < MIN_CONTRAST_REPLICATES:
                raise ConfigError(
                    f"contrasts.{name}: arm {side} has {count} replicate(s); a contrast across inits needs at least "
                    f"{MIN_CONTRAST_REPLICATES} a side, so its interval holds init-to-init spread"
                )
        if contrast.arm == contrast.against:
            raise ConfigError(f"contrasts.{name}: an arm against itself")


def number_sets(models: list[ArmModel]) -> list[tuple[str, int]]:
    """The (source, replicate) pairs of numbers some arm model reads, replicate by replicate,
    the teacher's before the base model's. Every source read at all is generated for each
    replicate that any arm has, so the arms of a replicate can train on equally many rows."""
    sources = [s for s in ("teacher", "base") if any(m.source == s for m in models)]
    return [(s, i) for i in range(max(m.replicate for m in models) + 1) for s in sources]
