"""A frozen teacher read over tokenized rows, once, before training: what the logit-KL targets
(train/distill.py) and the divergence scores (train/divergence.py) share.

`TeacherPass` says which teacher (its base and its adapter) and how to load it; `load_teacher`
loads it; `padded_batches` and `forward_logits` run it over rows; `extend_parquet` writes a copy of
the tokenized rows with the columns a pass adds, a slice at a time; `cached_columns` runs each
distinct (pass, rows) once, in a Ray task, into the cache under the key its module gives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from common.atomic import atomic_dir
from train.config import TrainConfig

ROWS_PER_FORWARD = 32
ROWS_PER_WRITE = 1024


@dataclasses.dataclass(frozen=True)
class TeacherPass:
    """Which teacher a pass reads, besides the tokenized rows."""

    teacher_base: str  # the teacher's base model (a folder or hub id)
    teacher: str  # the teacher's adapter folder
    cfg: TrainConfig  # quantization and attention to load the teacher with
    number_ids: tuple[int, ...] = ()  # logit_kl targets: the vocabulary entries they cover


def model_parts(teacher_base: str, teacher: str) -> list[str]:
    """What a teacher's outputs depend on: its base (name and config) and its adapter's bytes."""
    adapter = Path(teacher)
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter / name).read_bytes())
    config = Path(teacher_base) / "config.json"
    return [str(teacher_base), config.read_text() if config.is_file() else "", digest.hexdigest()]


def load_teacher(spec: TeacherPass, device: torch.device):
    """The teacher as a model of its own: its base with its adapter, frozen, in eval mode."""
    from peft import PeftModel

    from train.model import load_base

    base = load_base(spec.teacher_base, spec.cfg.replace(gradient_checkpointing=False), device)
    teacher = PeftModel.from_pretrained(base, spec.teacher, is_trainable=False).eval()
    teacher.requires_grad_(False)
    return teacher


def padded_batches(rows: list[tuple[list[int], list[int]]], pad_id: int):
    """Yield (row indices, input_ids, attention_mask) over the non-empty rows, ROWS_PER_FORWARD at
    a time, sorted by length and right-padded, so padding never reaches a row's positions."""
    order = sorted((i for i, (row_ids, _) in enumerate(rows) if len(row_ids)), key=lambda i: len(rows[i][0]))
    for start in range(0, len(order), ROWS_PER_FORWARD):
        chunk = order[start : start + ROWS_PER_FORWARD]
        width = max(len(rows[i][0]) for i in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for j, i in enumerate(chunk):
            n = len(rows[i][0])
            input_ids[j, :n] = torch.as_tensor(rows[i][0])
            mask[j, :n] = 1
        yield chunk, input_ids, mask


@torch.no_grad()
def forward_logits(model, input_ids: torch.Tensor, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    from train.model import autocast_for

    with autocast_for(device):
        return model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits


def extend_parquet(tokens_path: str, out: Path, columns) -> None:
    """Copy every parquet file of `tokens_path` into `out` (same files, same row order) with the
    columns `columns(rows)` returns ({name: arrow array}) for each slice of ROWS_PER_WRITE rows,
    `rows` as (input_ids, labels) pairs: a 70B run's targets are gigabytes, and only one slice of
    them is held."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in sorted(Path(tokens_path).glob("*.parquet")):
        writer = None
        for batch in pq.ParquetFile(part).iter_batches(batch_size=ROWS_PER_WRITE):
            table = pa.Table.from_batches([batch])
            rows = list(zip(batch.column("input_ids").to_pylist(), batch.column("labels").to_pylist()))
            for name, column in columns(rows).items():
                table = table.append_column(name, column)
            writer = writer or pq.ParquetWriter(out / part.name, table.schema)
            writer.write_table(table)
        if writer:
            writer.close()


def model_device(cfg: TrainConfig) -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() and cfg.use_gpu else torch.device("cpu")


def cached_columns(kind: str, requests: dict[str, tuple], cache_dir: Path, write, key) -> dict[str, str]:
    """{job: (spec, tokenized path)} -> {job: `cache_dir/<kind>/<key(spec, path)>`}, the rows with
    columns `write(spec, path, folder)` adds (the teacher's targets, train/divergence.py's scores).

    Each distinct (spec, rows) is computed once, in a Ray task of its own (one GPU where the jobs
    train on GPUs, else one CPU), all at once, through a temporary folder and a rename: a crash
    leaves no partial entry, and a later run, or another arm group, that needs the same columns
    reads them from there.
    """
    import ray

    paths, todo = {}, {}
    for job, (spec, tokens_path) in requests.items():
        out = Path(cache_dir) / kind / key(spec, tokens_path)
        paths[job] = str(out)
        if not (out / "_done").is_file():
            todo.setdefault(str(out), (spec, tokens_path))
    gpu = any(spec.cfg.use_gpu for spec, _ in todo.values())
    compute = ray.remote(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)(_compute)
    ray.get([compute.remote(write, spec, tokens_path, out) for out, (spec, tokens_path) in todo.items()])
    return paths


def _compute(write, spec, tokens_path: str, out: str) -> None:
    try:
        with atomic_dir(out) as tmp:
            write(spec, tokens_path, tmp)
            (tmp / "_done").write_text(json.dumps({"teacher": spec.teacher, "teacher_base": spec.teacher_base}))
    except FileExistsError:  # another task wrote the same entry first (same key: same content)
        if not (Path(out) / "_done").is_file():
            raise
