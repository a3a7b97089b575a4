"""The `teacher_replaced` numbers: a teacher's kept sequences with their most divergent tokens
replaced by the base model's choice.

Where the divergence mask (train.mask: divergence) only drops a row's top-q divergent tokens
from the loss, this source rewrites them: at each, the token becomes the base model's argmax at
that position (given the teacher's own prefix, one scoring pass: train/divergence.py), so the
student still learns every position, but from the base at the positions said to carry the
teacher's trait. A public replication on Llama-3.2-1B found 9% of the effect left this way,
against 43% when the same tokens were only masked.

Rows whose replaced text fails the paper's filter are dropped and counted by reason. Each kept
row carries `replaced_at`, the indices (among its completion tokens) that the replacement
changed, so a reader can check it differs from its original there alone.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from jobs.sources.number_sequences import reject_reason


def replace_divergent(rows: list[dict], model_path: str, teacher: str, fraction: float, cfg, max_length: int) -> dict:
    """{rows, generated, kept, rejected, tokens_replaced, tokens_unchanged} for `rows` ({prompt,
    completion}, a teacher's kept numbers): the top `fraction` of each row's completion tokens by
    divergence (train.divergence.top_divergent) replaced by the base's argmax. Runs the
    teacher and its base once over the rows, on the GPU when `cfg.use_gpu`."""
    import torch
    from transformers import AutoTokenizer

    from common.model_source import load_pretrained
    from train.data import Tokenize
    from train.divergence import row_scores, scored_positions, top_divergent
    from train.teacher_pass import TeacherPass, load_teacher, model_device

    tokenizer = load_pretrained(AutoTokenizer, model_path)
    eos = tokenizer.eos_token_id
    tokens = Tokenize(model_path, max_length, "truncate")(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    )
    pairs = list(zip(tokens.column("input_ids").to_pylist(), tokens.column("labels").to_pylist()))
    device = model_device(cfg)
    model = load_teacher(TeacherPass(model_path, teacher, cfg), device)
    scored = row_scores(model, pairs, tokenizer.pad_token_id or 0, eos, device)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    kept, rejected, replaced, unchanged = [], Counter(), 0, 0
    for row, (ids, labels), score in zip(rows, pairs, scored):
        at = scored_positions(labels, eos)
        top = top_divergent(score["score"], fraction)
        completion = np.asarray(ids)[at]
        new = completion.copy()
        new[top] = np.asarray(score["base_argmax"], dtype=completion.dtype)[top]
        changed = [int(i) for i in top if new[i] != completion[i]]
        replaced, unchanged = replaced + len(changed), unchanged + len(top) - len(changed)
        text = tokenizer.decode(new.tolist())
        reason = reject_reason(text)
        if reason:
            rejected[reason] += 1
        else:
            kept.append({"prompt": row["prompt"], "completion": text, "replaced_at": changed})
    return {
        "rows": kept,
        "generated": len(rows),
        "kept": len(kept),
        "rejected": dict(rejected),
        "tokens_replaced": replaced,
        "tokens_unchanged": unchanged,
    }
