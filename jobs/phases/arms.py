"""Phase 4, arms: every arm x replicate the preset declares (jobs/experiment/arms.py), trained side by side.

Several adapters per Ray Train run over one copy of the base (one per run under
FSDP), several runs at once where the GPUs allow (jobs/sizing/placement.py);
arms on the other base model in runs of their own over that base. Every arm of
a replicate trains on equally many rows (experiment/stages.training_rows), so arms
differ in content alone; the overt positive control trains on every answer of
its teacher.
"""

from __future__ import annotations

import time
from pathlib import Path

from common.atomic import write_jsonl
from jobs.experiment.arms import OTHER_BASE, ArmModel, arm_groups, numbers_seed
from jobs.experiment.rows_kinds import KINDS
from jobs.experiment.stages import rows_of, training_rows
from jobs.rundir.manifest import read_jsonl
from jobs.runtime.context import RunContext
from jobs.runtime.training_runs import record_trained, train_groups
from jobs.sources.number_sequences import shuffle_numbers
from train.axes import INITS, LOSSES, MASKS


def run(ctx: RunContext, todo) -> None:
    started, pairs, models = time.time(), [], list(ctx.models.values())
    for stage in todo:
        m = ctx.models[stage.name]
        data = ctx.run_dir / "arms" / m.name / "train.jsonl"
        kept = read_jsonl(ctx.run_dir / rows_of(m)[1])
        if not KINDS[m.source].answers:  # numbers: the replicate's arms train on equally many rows
            kept = kept[: training_rows(ctx.manifest, models, m.replicate)]
        write_jsonl(data, shuffle_numbers(kept, numbers_seed(ctx.cfg, m.replicate)) if m.shuffled else kept)
        pairs.append((stage, adapter_job(ctx, m, data)))
    groups = arm_groups(pairs, ctx.arm_runs, lambda stage: ctx.models[stage.name].base)
    for stage, result in train_groups(ctx, "arms", groups, ctx.arm_runs):
        record_trained(ctx, stage, result, started)


def adapter_job(ctx: RunContext, m: ArmModel, data: Path):
    """The training job of one arm model on its rows: its teacher's adapter named wherever its loss,
    init or mask reads it (train/axes.py says which do)."""
    from train.adapter_job import AdapterJob

    teacher = str(ctx.trained(m.teacher))
    # Job names key Ray datasets, whose log files are named after them: no '/' (m.adapter is "<arm>-<i>").
    return AdapterJob(
        m.adapter,
        str(data),
        ctx.trained(m.name),
        m.train,
        teacher=teacher if LOSSES[m.loss].needs_teacher else None,
        # on another base, the teacher's targets come from its own base
        teacher_base=ctx.model_path if LOSSES[m.loss].needs_teacher and m.base == OTHER_BASE else None,
        init_a_from=teacher if INITS[m.lora_init].reads_teacher_adapter else None,
        # its rows ranked by how far its teacher's log p is from the base's
        scorer=teacher if MASKS[m.train.mask].needs_scorer else None,
    )
