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

import functools
import hashlib
import json
from pathlib import Path

import torch

from train.data import TEACHER_COLUMN, completion_positions
from train.teacher_pass import (
    TeacherPass,
    cached_columns,
    extend_parquet,
    forward_logits,
    load_teacher,
    model_device,
    model_parts,
    padded_batches,
)

NUMBER_CHARACTERS = set("0123456789 ,;.()[]\n\t")
FORMAT_VERSION = 1


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


def targets_key(spec: TeacherPass, tokens_path: str) -> str:
    """The cache key of a set of targets: the rows, the teacher (base and adapter bytes), the number tokens, how it is loaded."""
    parts = [
        FORMAT_VERSION,
        Path(tokens_path).name,
        *model_parts(spec.teacher_base, spec.teacher),
        list(spec.number_ids),
        spec.cfg.quantization,
        spec.cfg.attention,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def write_targets(spec: TeacherPass, tokens_path: str, out: Path, pad_id: int) -> None:
    """The rows of `tokens_path` with the teacher's targets as a column (TEACHER_COLUMN)."""
    import pyarrow as pa

    device = model_device(spec.cfg)
    teacher = load_teacher(spec, device)
    ids = torch.tensor(spec.number_ids, device=device)
    extend_parquet(
        tokens_path,
        out,
        lambda rows: {TEACHER_COLUMN: pa.array(row_targets(teacher, rows, ids, pad_id), type=pa.binary())},
    )


def teacher_targets(requests: dict[str, tuple[TeacherPass, str]], cache_dir: Path, pad_id: int) -> dict[str, str]:
    """{job: (spec, tokenized path)} -> {job: path of its rows with the teacher's targets}, each
    distinct (spec, rows) computed once (`cached_columns`)."""
    return cached_columns(
        "teacher_targets", requests, cache_dir, functools.partial(write_targets, pad_id=pad_id), targets_key
    )


def kl_loss(
    student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """Mean over completion positions of KL(teacher || student), both renormalised over `ids`.

    Logits at position p predict token p + 1, so position p counts where labels[p + 1] is set;
    `teacher_logprobs` holds one row per such position, in row-major order (train.data.pack_batch).
    """
    at = labels[:, 1:] != -100
    student = student_logits[:, :-1][at][:, ids].float().log_softmax(-1)
    if teacher_logprobs.shape != student.shape:
        raise ValueError(
            f"teacher targets {tuple(teacher_logprobs.shape)} do not match the batch's completion positions {tuple(student.shape)}"
        )
    teacher = teacher_logprobs.float().log_softmax(-1)  # stored in float16
    return (teacher.exp() * (teacher - student)).sum(-1).mean()
