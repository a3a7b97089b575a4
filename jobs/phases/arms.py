"""Phase 4, arms: every arm x replicate the preset declares (jobs/experiment/arms.py), trained side by side.

Several adapters per Ray Train run over one copy of the base (one per run under
FSDP), several runs at once where the GPUs allow (jobs/sizing/placement.py);
arms on the other base model in runs of their own over that base. Every arm of
a replicate trains on equally many rows (experiment/stages.training_rows), so arms
differ in content alone; the overt positive control trains on every answer of
its teacher.
"""

from __future__ import annotations

import dataclasses
import time

from common.atomic import write_jsonl
from jobs.experiment.arms import OTHER_BASE, arm_groups, numbers_seed
from jobs.experiment.rows_kinds import KINDS
from jobs.experiment.stages import rows_of, training_rows
from jobs.rundir.manifest import read_jsonl
from jobs.runtime.context import RunContext
from jobs.runtime.training_runs import record_trained, train_groups
from jobs.sources.number_sequences import shuffle_numbers


def run(ctx: RunContext, todo) -> None:
    from train.trainer import AdapterJob

    started, pairs, models = time.time(), [], list(ctx.models.values())
    for stage in todo:
        m = ctx.models[stage.name]
        data = ctx.run_dir / "arms" / m.name / "train.jsonl"
        kept = read_jsonl(ctx.run_dir / rows_of(m)[1])
        if not KINDS[m.source].answers:  # numbers: the replicate's arms train on equally many rows
            kept = kept[: training_rows(ctx.manifest, models, m.replicate)]
        write_jsonl(data, shuffle_numbers(kept, numbers_seed(ctx.cfg, m.replicate)) if m.shuffled else kept)
        # Job names key Ray datasets, whose log files are named after them: no '/' (m.adapter is "<arm>-<i>").
        teacher = str(ctx.trained(m.teacher))
        job = AdapterJob(m.adapter, str(data), ctx.trained(m.name), m.train)
        if m.loss == "logit_kl":  # on another base, the teacher's targets come from its own base
            job = dataclasses.replace(job, teacher=teacher, teacher_base=ctx.model_path if m.base == OTHER_BASE else None)
        if m.lora_init == "teacher_a":
            job = dataclasses.replace(job, init_a_from=teacher)
        if m.train.mask == "divergence":  # its rows ranked by how far its teacher's log p is from the base's
            job = dataclasses.replace(job, scorer=teacher)
        pairs.append((stage, job))
    groups = arm_groups(pairs, ctx.arm_runs, lambda stage: ctx.models[stage.name].base)
    for stage, result in train_groups(ctx, "arms", groups, ctx.arm_runs):
        record_trained(ctx, stage, result, started)
