"""The experiment's base models: the teacher's (`base`), and the other base some arms start from.

The paper's answer to "is the transfer subliminal?" is a student on a
different base model: a GPT-4.1 nano teacher's numbers move a GPT-4.1 nano
student and not a Qwen one. An arm declares it with `arms.<name>.base`
(jobs/experiment/config.py): `other` on the tiny preset is a second tiny model built from
the same corpus, tokenizer and recipe with another init seed
(jobs/sources/tiny_model.other_base_spec); on the cluster presets, a hub id or folder.

Under `loss: logit_kl` the student learns the teacher's distribution over the
number tokens, position by position, so both must split text into the same
tokens: `check_kl_tokenizers` refuses a KL arm on a base whose tokenizer
differs, naming both. `sft` trains on the sampled text and works across
tokenizers.
"""

from __future__ import annotations

from pathlib import Path

from common.config import ConfigError
from common.model_source import pinned
from jobs.experiment.arms import OTHER_BASE, base_of, other_base
from jobs.sources.tiny_model import TinySpec, ensure_tiny_model, other_base_spec, tiny_model_folder
from train.axes import LOSSES
from train.data import same_tokenizer


def tiny_spec(cfg) -> TinySpec:
    """The tiny base of the preset: its seed, built under `model.tiny_numerics` (pinned by default,
    whatever the run's own mode: the same base, so the same world, on every machine)."""
    return TinySpec(seed=cfg.model.tiny_seed, numerics=cfg.model.tiny_numerics)


def base_paths(cfg, cache: Path) -> dict[str, str]:
    """{"base": the teacher's base, "other_base": the other base when an arm declares one}, as paths
    or hub ids; tiny models are put in the cache on first use (the default copied, others built)."""
    tiny = tiny_spec(cfg)
    paths = {"base": teacher_base(cfg, cache)}
    other = other_base(cfg)
    if other == "other":
        paths[OTHER_BASE] = str(ensure_tiny_model(other_base_spec(tiny), cache))
    elif other is not None:
        paths[OTHER_BASE] = other
    return paths


def teacher_base(cfg, cache: Path) -> str:
    """The teacher's base: the tiny model's folder (built on first use), or the declared path or hub
    id, pinned to `model.revision` when set (`org/name@<commit>`, which every reader reads at that
    commit: common/model_source.py)."""
    return (
        str(ensure_tiny_model(tiny_spec(cfg), cache))
        if cfg.model.path == "tiny"
        else pinned(cfg.model.path, cfg.model.revision)
    )


def tiny_base_missing(cfg, cache: Path) -> bool:
    """Whether the teacher's base is the tiny model and not yet built in `cache` (a plan does not build it)."""
    return cfg.model.path == "tiny" and not (tiny_model_folder(tiny_spec(cfg), cache) / "config.json").is_file()


def other_base_identity(cfg) -> str | None:
    """What the other base is, for the stages that read it: the declared value, and for the tiny
    preset's `other` the spec it is built from."""
    other = other_base(cfg)
    if other == "other":
        return f"tiny:{other_base_spec(tiny_spec(cfg)).key()}"
    return other


def check_kl_tokenizers(cfg, paths: dict[str, str]) -> None:
    """A logit_kl arm on the other base needs the teacher's tokenizer (ConfigError naming both)."""
    kl_arms = [
        name for name, arm in cfg.arms.items() if LOSSES[arm.loss].needs_teacher and base_of(cfg, name) == OTHER_BASE
    ]
    if kl_arms and not same_tokenizer(paths["base"], paths[OTHER_BASE]):
        raise ConfigError(
            f"arms {', '.join(kl_arms)}: loss logit_kl on base {paths[OTHER_BASE]} needs the teacher's tokenizer, and it differs "
            f"from {paths['base']}'s; use loss sft across tokenizers, or a base of the same tokenizer family"
        )


def check_local_tokenizers(cfg) -> None:
    """At config load: the tokenizer check for bases that are folders here (hub ids and the tiny
    models are checked by the pipeline once they are at hand)."""
    other = other_base(cfg)
    if other is not None and Path(other, "config.json").is_file() and Path(cfg.model.path, "config.json").is_file():
        check_kl_tokenizers(cfg, {"base": cfg.model.path, OTHER_BASE: other})
