"""Phase 1, data: the WMDP questions split into teacher-train and held-out, disjoint by text.

Writes data/teacher_train.jsonl (the teacher's training rows: each question's
prompt completed by its answer letter), data/train_questions.jsonl and
data/held_out.jsonl (the questions every model is scored on).
"""

from __future__ import annotations

import time

from common.atomic import write_jsonl
from jobs.phases.context import RunContext
from jobs.phases.stages import SPLIT_FILES, TEACHER_TRAIN
from jobs.rundir.manifest import digest
from jobs.sources.wmdp import split_questions
from serve.mc_format import choice_continuation, format_mc_prompt


def mc_rows(questions: list[dict], letter: int | None = None) -> list[dict]:
    """Teacher training rows: each question's WMDP prompt, completed by its answer (or by `letter`)."""
    return [
        {"prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]), "completion": choice_continuation(q["answer"] if letter is None else letter)}
        for q in questions
    ]


def run(ctx: RunContext, todo) -> None:
    started, cfg = time.time(), ctx.cfg
    train_q, eval_q = split_questions(ctx.questions, cfg.data.eval_fraction, cfg.data.split_seed)
    train_hash = write_jsonl(ctx.run_dir / TEACHER_TRAIN, mc_rows(train_q))
    questions_hash = write_jsonl(ctx.run_dir / "data" / SPLIT_FILES["train"], train_q)  # scored too
    eval_hash = write_jsonl(ctx.run_dir / "data" / SPLIT_FILES["held_out"], eval_q)
    print(f"[data] {len(train_q)} teacher-train and {len(eval_q)} held-out questions", flush=True)
    ctx.record(todo[0], started, {"hash": digest(train_hash, questions_hash, eval_hash), "train": len(train_q), "held_out": len(eval_q)})
