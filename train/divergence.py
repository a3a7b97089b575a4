"""Where a teacher's numbers diverge from its base: a score per completion token, and the masks built on it.

Subliminal signal is said to ride on rare "divergence tokens", positions where a teacher with a
trait predicts another next token than one without it (Schrodi et al., ICLR 2026). Lacking a
second teacher, a token's score here is

    score = log p_teacher(token | prefix) - log p_base(token | prefix),

each a full-vocabulary log-softmax: the teacher is its base with its LoRA adapter, the base the
same model with the adapter disabled, so one model is loaded and each batch runs two forwards.
The teacher's logit-KL targets (train/distill.py) are not reused for it: they are renormalised
over the number tokens, and the score is the full distributions' difference.

Scored tokens are a row's completion tokens (labels set) without the EOS the tokenizer appends:
the numbers themselves, not the end of the row. `scored_positions` gives them; each row carries,
in that order, its scores (SCORE_COLUMN, float32 bytes) and both models' argmax at each
(TEACHER_ARGMAX, BASE_ARGMAX, int32 lists), as columns of a copy of the tokenized parquet cache
in `cache_dir/divergence/<key>`, computed once per (teacher, rows) like the targets.

Masks (`TrainConfig.mask`) drop k = ceil(mask_fraction x n) of a row's n scored tokens from the
loss (their labels set to -100, in another copy, `cache_dir/masked/<key>`):
- `divergence`: the k highest scores (the earlier position first on a tie);
- `random`: k positions drawn by a generator seeded with (the job's data-order seed, the row's
  token ids), so a replicate masks the same tokens of a row every epoch, and another replicate
  others. It is the control the divergence mask is read against: the same number of tokens
  dropped, chosen blind.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from common.atomic import atomic_dir
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

SCORE_COLUMN = "divergence"
TEACHER_ARGMAX = "teacher_argmax"
BASE_ARGMAX = "base_argmax"
FORMAT_VERSION = 1


def scores_key(spec: TeacherPass, tokens_path: str) -> str:
    """The cache key of a set of scores: the rows, the teacher (base and adapter bytes), how it is loaded."""
    parts = [
        "divergence",
        FORMAT_VERSION,
        Path(tokens_path).name,
        *model_parts(spec.teacher_base, spec.teacher),
        spec.cfg.quantization,
        spec.cfg.attention,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def scored_positions(labels, eos_id: int | None) -> np.ndarray:
    """Indices t of a row's scored tokens: labels[t] set, t > 0, and not a final EOS."""
    labels = np.asarray(labels)
    at = np.nonzero(labels != -100)[0]
    at = at[at > 0]
    if len(at) and eos_id is not None and labels[at[-1]] == eos_id:
        at = at[:-1]
    return at


@torch.no_grad()
def row_scores(
    model, rows: list[tuple[list[int], list[int]]], pad_id: int, eos_id: int | None, device: torch.device
) -> list[dict]:
    """Per row: {score: float32 [n], teacher_argmax, base_argmax: int [n]} at its scored positions.
    `model` is the teacher (a PeftModel); its adapter disabled, the base."""
    out = [{"score": np.zeros(0, np.float32), "teacher_argmax": [], "base_argmax": []} for _ in rows]
    for chunk, input_ids, mask in padded_batches(rows, pad_id):
        teacher = forward_logits(model, input_ids, mask, device).float().log_softmax(-1)
        with model.disable_adapter():
            base = forward_logits(model, input_ids, mask, device).float().log_softmax(-1)
        for j, i in enumerate(chunk):
            at = torch.as_tensor(scored_positions(rows[i][1], eos_id), device=device)
            pred = at - 1  # logits at t - 1 predict token t
            tokens = input_ids[j].to(device)[at]
            rows_t, rows_b = teacher[j, pred], base[j, pred]
            out[i] = {
                "score": (rows_t.gather(-1, tokens[:, None]) - rows_b.gather(-1, tokens[:, None]))[:, 0]
                .cpu()
                .numpy()
                .astype(np.float32),
                "teacher_argmax": rows_t.argmax(-1).tolist(),
                "base_argmax": rows_b.argmax(-1).tolist(),
            }
    return out


def write_scores(spec: TeacherPass, tokens_path: str, out: Path, pad_id: int, eos_id: int | None) -> None:
    """The rows of `tokens_path` with their scores and both argmaxes as columns."""
    import pyarrow as pa

    device = model_device(spec.cfg)
    model = load_teacher(spec, device)

    def columns(rows):
        scored = row_scores(model, rows, pad_id, eos_id, device)
        return {
            SCORE_COLUMN: pa.array([r["score"].tobytes() for r in scored], type=pa.binary()),
            TEACHER_ARGMAX: pa.array([r["teacher_argmax"] for r in scored], type=pa.list_(pa.int32())),
            BASE_ARGMAX: pa.array([r["base_argmax"] for r in scored], type=pa.list_(pa.int32())),
        }

    extend_parquet(tokens_path, out, columns)


def divergence_scores(
    requests: dict[str, tuple[TeacherPass, str]], cache_dir: Path, pad_id: int, eos_id: int | None
) -> dict[str, str]:
    """{job: (spec, tokenized path)} -> {job: path of its rows with their scores}, each distinct
    (spec, rows) computed once, in a Ray task (train.teacher_pass.cached_columns)."""
    return cached_columns(
        "divergence", requests, cache_dir, functools.partial(write_scores, pad_id=pad_id, eos_id=eos_id), scores_key
    )


def read_scores(stored: bytes) -> np.ndarray:
    return np.frombuffer(stored, dtype=np.float32)


def masked_count(n: int, fraction: float) -> int:
    """How many of a row's n scored tokens a mask drops: ceil(fraction x n), at least one of any."""
    return min(n, math.ceil(round(fraction * n, 9)))


def top_divergent(scores: np.ndarray, fraction: float) -> np.ndarray:
    """Indices (ascending) of a row's masked_count(n, fraction) highest scores, the earlier first on a tie."""
    return np.sort(np.argsort(-scores, kind="stable")[: masked_count(len(scores), fraction)])


def mask_positions(row: dict, mask: str, fraction: float, seed: int, eos_id: int | None) -> np.ndarray:
    """The positions of a row (input_ids, labels, and the score column for `divergence`) a mask drops."""
    at = scored_positions(row["labels"], eos_id)
    if mask == "divergence":
        return at[top_divergent(read_scores(row[SCORE_COLUMN]), fraction)]
    if mask == "random":
        ids = np.asarray(row["input_ids"], dtype=np.int32)
        order = np.random.default_rng([seed, zlib.crc32(ids.tobytes())]).permutation(len(at))
        return np.sort(at[order[: masked_count(len(at), fraction)]])
    raise ValueError(f"mask {mask!r} is not divergence or random")


def masked_rows(tokens_path: str, cache_dir: Path, mask: str, fraction: float, seed: int, eos_id: int | None) -> str:
    """A copy of the rows of `tokens_path` (for `divergence`, rows with their scores) whose masked
    positions have no label; cached in `cache_dir/masked/<key>`. Each row also gets `masked`, the
    count of its dropped tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = hashlib.sha256(
        json.dumps(
            [FORMAT_VERSION, Path(tokens_path).name, mask, fraction, seed if mask == "random" else None]
        ).encode()
    ).hexdigest()[:16]
    out = Path(cache_dir) / "masked" / key
    if (out / "_done").is_file():
        return str(out)
    try:
        with atomic_dir(out) as tmp:
            for part in sorted(Path(tokens_path).glob("*.parquet")):
                table = pq.read_table(part)
                labels, counts = [], []
                for row in table.to_pylist():
                    drop = mask_positions(row, mask, fraction, seed, eos_id)
                    row_labels = np.asarray(row["labels"], dtype=np.int32)
                    row_labels[drop] = -100
                    labels.append(row_labels.tolist())
                    counts.append(len(drop))
                table = table.set_column(
                    table.schema.get_field_index("labels"), "labels", pa.array(labels, type=pa.list_(pa.int32()))
                )
                pq.write_table(table.append_column("masked", pa.array(counts, type=pa.int32())), tmp / part.name)
            (tmp / "_done").write_text(json.dumps({"rows": tokens_path, "mask": mask, "fraction": fraction}))
    except FileExistsError:  # another job wrote the same entry first (same key: same content)
        pass
    return str(out)
