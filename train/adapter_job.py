"""One adapter of a `train_lora_many` run as its caller describes it (`AdapterJob`), and what a run's
jobs must be before Ray does any work (`check_jobs`, `check_teacher_bases`): distinct, agreeing on
the worker group they share (`SHARED_KEYS`, by which jobs/experiment/arms.py also groups arms into
runs), their teacher, scorer and init adapters real adapter folders, a teacher on another base
reading this base's tokens.

Apart from the driver (train/trainer.py), so that a job's fields and the rules on them read in one
place.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigError
from train.axes import MASKS
from train.config import TrainConfig
from train.data import same_tokenizer

# Settings of the worker group itself, which every job of a run must share (and `method`: a LoRA
# run keeps one frozen base for all its jobs, a full one loads a base of its own per job).
SHARED_KEYS = (
    "method",
    "num_workers",
    "use_gpu",
    "strategy",
    "quantization",
    "attention",
    "gradient_checkpointing",
    "kernels",
    "max_failures",
    "keep_checkpoints",
    "cpus_per_worker",
)


@dataclass(frozen=True)
class AdapterJob:
    """One adapter of a `train_lora_many` run.

    `name` keys its dataset, its checkpoints' state and its reported metrics;
    `data` is a JSONL/parquet path or a Ray Dataset of `{prompt, completion}` rows.
    """

    name: str
    data: Any
    output_dir: Path
    cfg: TrainConfig
    teacher: str | None = None  # a teacher adapter folder: train by logit KL to it (train/distill.py), not SFT
    # the teacher's base when it is not this run's (a student on another base, same tokenizer)
    teacher_base: str | None = None
    # an adapter folder whose LoRA A this adapter starts from, frozen (lora_init teacher_a)
    init_a_from: str | None = None
    # mask divergence: the adapter (on this run's base) whose divergence from the base scores the rows
    scorer: str | None = None


def check_jobs(jobs: list[AdapterJob]) -> None:
    """Jobs must be distinct and agree on the worker group; FSDP runs one job (ConfigError otherwise)."""
    if not jobs:
        raise ConfigError("train_lora_many needs at least one job")
    for field in ("name", "output_dir"):
        values = [str(Path(j.output_dir).absolute()) if field == "output_dir" else j.name for j in jobs]
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ConfigError(f"two jobs have the same {field} {repeated[0]}")
    if named := [j.name for j in jobs if "@" in j.name]:  # "<job>@<rank>" names a job's part per worker (job_datasets)
        raise ConfigError(f"job name {named[0]!r}: '@' is kept for the per-worker parts of a job's rows")
    first = jobs[0]
    for job in jobs[1:]:
        for key in SHARED_KEYS:
            if getattr(job.cfg, key) != getattr(first.cfg, key):
                raise ConfigError(
                    f"{key}: jobs of one run share one worker group and must agree on it;"
                    f" job {first.name} has {getattr(first.cfg, key)!r}, job {job.name} has {getattr(job.cfg, key)!r}"
                )
    for job in jobs:
        for role, folder in (("teacher", job.teacher), ("init_a_from", job.init_a_from)):
            if folder is not None and not (Path(folder) / "adapter_config.json").is_file():
                raise ConfigError(
                    f"job {job.name}: its {role} {folder} is not a PEFT adapter folder (no adapter_config.json)"
                )
        if job.init_a_from is not None and job.cfg.method != "lora":
            raise ConfigError(
                f"job {job.name}: init_a_from starts a LoRA adapter from another's A; method {job.cfg.method} trains no adapter"
            )
        if job.teacher_base is not None and job.teacher is None:
            raise ConfigError(
                f"job {job.name}: teacher_base is the base of a logit_kl teacher; the job names no teacher"
            )
        if MASKS[job.cfg.mask].drops_tokens and job.teacher is not None:
            raise ConfigError(
                f"job {job.name}: mask {job.cfg.mask} drops tokens from an SFT loss; a logit_kl job (teacher given) has none to drop"
            )
        if MASKS[job.cfg.mask].needs_scorer != (job.scorer is not None):
            raise ConfigError(
                f"job {job.name}: mask divergence needs a scorer (the teacher adapter whose divergence from the base ranks tokens), and only it takes one"
            )
        if job.scorer is not None and not (Path(job.scorer) / "adapter_config.json").is_file():
            raise ConfigError(
                f"job {job.name}: its scorer {job.scorer} is not a PEFT adapter folder (no adapter_config.json)"
            )
    if first.cfg.strategy == "fsdp" and len(jobs) > 1:
        raise ConfigError(
            f"strategy=fsdp trains one job per run ({len(jobs)} given): FSDP2 shards the model, adapter"
            " included, once in place, so the adapter cannot be swapped for the next job's"
        )


def check_teacher_bases(jobs: list[AdapterJob], model_path: str) -> None:
    """A logit-KL job's teacher on another base must share this base's tokenizer: its targets are
    the teacher's reading of this base's token ids. Checked once per teacher base, not per job."""
    for base in {j.teacher_base for j in jobs if j.teacher_base} - {model_path}:
        if not same_tokenizer(base, model_path):
            names = ", ".join(j.name for j in jobs if j.teacher_base == base)
            raise ConfigError(
                f"job {names}: logit_kl needs one tokenizer, and its teacher's base {base} has another than {model_path}"
            )
