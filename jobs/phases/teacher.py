"""Phase 2, teacher: Ray Train LoRA on the teacher-train split.

With it, when an arm needs them, the positive control's letter teacher (every
teacher-train question answered with one letter, `letter_teacher.letter`) and
the sham teacher (the teacher's rows with each train question answered by the
sham's fact, or the answers permuted across questions: data.sham_rows). All are one Ray Train run (they share every
setting), from the same LoRA init.
"""

from __future__ import annotations

import time

from common.atomic import write_jsonl
from jobs.experiment.stages import SPLIT_FILES, TEACHER_TRAIN
from jobs.phases.data import mc_rows, sham_rows
from jobs.rundir.manifest import read_jsonl
from jobs.runtime.context import RunContext
from jobs.runtime.training_runs import record_trained, train_groups
from serve.mc_format import LETTERS


def run(ctx: RunContext, todo) -> None:
    from train.adapter_job import AdapterJob

    started, pairs = time.time(), []
    for stage in todo:
        data = ctx.run_dir / TEACHER_TRAIN
        if stage.name == "letter_teacher":
            data = ctx.run_dir / "letter_teacher" / "train.jsonl"
            questions = read_jsonl(ctx.run_dir / "data" / SPLIT_FILES["train"])
            write_jsonl(data, mc_rows(questions, LETTERS.index(ctx.cfg.letter_teacher.letter)))
        elif stage.name == "sham_teacher":
            data = ctx.run_dir / "sham_teacher" / "train.jsonl"
            questions = read_jsonl(ctx.run_dir / "data" / SPLIT_FILES["train"])
            sham = ctx.cfg.sham_teacher
            draw = {"draw": ctx.world["sham_draw"]} if ctx.world else {}  # the world's draw, for the null shams' facts
            rows = sham_rows(
                read_jsonl(ctx.run_dir / TEACHER_TRAIN),
                questions,
                ctx.cfg.evaluate.format,
                sham.kind,
                sham.seed,
                pair=ctx.cfg.data.pair,
                **draw,
            )
            write_jsonl(data, rows)
        pairs.append((stage, AdapterJob(stage.name, str(data), ctx.trained(stage.name), ctx.cfg.teacher)))
    for stage, result in train_groups(ctx, "teacher", [pairs], runs=1):
        record_trained(ctx, stage, result, started)
