"""Soft-label distillation (the `logit_kl` loss): KL(teacher || student) over the number vocabulary.

The teacher's side is computed once per tokenized dataset, before training, and
stored beside the rows: `teacher_targets` runs the teacher (its base with its
LoRA adapter, frozen) over every row and writes, per row, its log-probabilities
over the number tokens at each completion position, as a `teacher_logprobs`
column of a copy of the tokenized parquet cache. Every logit_kl job that reads
the same rows (same numbers, tokenizer, max_length and data order) with the
same teacher shares that copy, whatever its base, LoRA seed or init: on the
evidence preset the four KL arms of a replicate read one. Training runs no
teacher forward and holds no second model, which also lets a student on
another base (same tokenizer) learn from the teacher without loading the
teacher's base beside its own. The targets are exact (every number token, no
top-k cut), stored in float16 (renormalised in float32 at use) and deterministic:
the teacher runs in eval mode, so every epoch of every arm saw the same values
when they were recomputed in the loop.

The KL is taken at every completion position (where the labels are set), over
the tokens a number-sequence completion is made of (digits, the filter's
separators and brackets, whitespace, end of text), each side renormalised over
that set: the student learns the teacher's whole distribution over what it
could write next, not the one token it sampled.

Size: rows x completion positions x number tokens x 2 bytes. The tiny preset's
600 rows x ~20 positions x 172 tokens take 4 MB; at Llama 3's ~1,500 number
tokens, 30k rows of ~50 positions take about 4.5 GB of parquet per replicate.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import torch

from common.atomic import atomic_dir
from train.config import TrainConfig
from train.data import TEACHER_COLUMN, completion_positions

NUMBER_CHARACTERS = set("0123456789 ,;.()[]\n\t")
FORMAT_VERSION = 1
ROWS_PER_FORWARD = 32
ROWS_PER_WRITE = 1024


def number_token_ids(tokenizer) -> list[int]:
    """Ids of the tokens made only of digits, separators, brackets and whitespace, plus EOS."""
    ids = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if text and set(text) <= NUMBER_CHARACTERS:
            ids.append(i)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not any(tokenizer.decode([i]).strip().isdigit() for i in ids):
        raise ValueError("the tokenizer has no digit tokens: logit_kl cannot distil number sequences with it")
    return sorted(ids)


@dataclasses.dataclass(frozen=True)
class TargetsSpec:
    """What a set of teacher targets depends on, besides the tokenized rows."""

    teacher_base: str  # the teacher's base model (a folder or hub id)
    teacher: str  # the teacher's adapter folder
    number_ids: tuple[int, ...]
    cfg: TrainConfig  # quantization and attention to load the teacher with

    def key(self, tokens_path: str) -> str:
        parts = [
            FORMAT_VERSION,
            Path(tokens_path).name,
            *model_parts(self.teacher_base, self.teacher),
            list(self.number_ids),
            self.cfg.quantization,
            self.cfg.attention,
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def model_parts(teacher_base: str, teacher: str) -> list[str]:
    """What a teacher's outputs depend on: its base (name and config) and its adapter's bytes."""
    adapter = Path(teacher)
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter / name).read_bytes())
    config = Path(teacher_base) / "config.json"
    return [str(teacher_base), config.read_text() if config.is_file() else "", digest.hexdigest()]


def load_teacher(spec: TargetsSpec, device: torch.device):
    """The teacher as a model of its own: its base with its adapter, frozen, in eval mode."""
    from peft import PeftModel

    from train.model import load_base

    base = load_base(spec.teacher_base, dataclasses.replace(spec.cfg, gradient_checkpointing=False), device)
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


@torch.no_grad()
def row_targets(teacher, rows: list[tuple[list[int], list[int]]], ids: torch.Tensor, pad_id: int) -> list[bytes]:
    """Each row's teacher log-probabilities over `ids` at its completion positions, float16 bytes
    (b"" for a row the tokenizer dropped)."""
    out: list[bytes] = [b""] * len(rows)
    for chunk, input_ids, mask in padded_batches(rows, pad_id):
        logits = forward_logits(teacher, input_ids, mask, ids.device)
        for j, i in enumerate(chunk):
            at = torch.as_tensor(completion_positions(rows[i][1]), device=ids.device)
            logprobs = logits[j, at][:, ids].float().log_softmax(-1)
            out[i] = logprobs.to(torch.float16).cpu().numpy().tobytes()
    return out


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


def write_targets(spec: TargetsSpec, tokens_path: str, out: Path, pad_id: int) -> None:
    """The rows of `tokens_path` with the teacher's targets as a column (TEACHER_COLUMN)."""
    import pyarrow as pa

    device = model_device(spec.cfg)
    teacher = load_teacher(spec, device)
    ids = torch.tensor(spec.number_ids, device=device)
    extend_parquet(tokens_path, out, lambda rows: {TEACHER_COLUMN: pa.array(row_targets(teacher, rows, ids, pad_id), type=pa.binary())})


def teacher_targets(requests: dict[str, tuple[TargetsSpec, str]], cache_dir: Path, pad_id: int) -> dict[str, str]:
    """{job: (spec, tokenized path)} -> {job: path of its rows with the teacher's targets}, each
    distinct (spec, rows) computed once (`cached_columns`)."""
    return cached_columns("teacher_targets", requests, cache_dir, functools.partial(write_targets, pad_id=pad_id))


def cached_columns(kind: str, requests: dict[str, tuple], cache_dir: Path, write) -> dict[str, str]:
    """{job: (spec, tokenized path)} -> {job: `cache_dir/<kind>/<spec.key(path)>`}, the rows with
    columns `write(spec, path, folder)` adds (the teacher's targets, train/divergence.py's scores).

    Each distinct (spec, rows) is computed once, in a Ray task of its own (one GPU where the jobs
    train on GPUs, else one CPU), all at once, through a temporary folder and a rename: a crash
    leaves no partial entry, and a later run, or another arm group, that needs the same columns
    reads them from there.
    """
    import ray

    paths, todo = {}, {}
    for job, (spec, tokens_path) in requests.items():
        out = Path(cache_dir) / kind / spec.key(tokens_path)
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


def kl_loss(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean over completion positions of KL(teacher || student), both renormalised over `ids`.

    Logits at position p predict token p + 1, so position p counts where labels[p + 1] is set;
    `teacher_logprobs` holds one row per such position, in row-major order (train.data.pack_batch).
    """
    at = labels[:, 1:] != -100
    student = student_logits[:, :-1][at][:, ids].float().log_softmax(-1)
    if teacher_logprobs.shape != student.shape:
        raise ValueError(f"teacher targets {tuple(teacher_logprobs.shape)} do not match the batch's completion positions {tuple(student.shape)}")
    teacher = teacher_logprobs.float().log_softmax(-1)  # stored in float16
    return (teacher.exp() * (teacher - student)).sum(-1).mean()
