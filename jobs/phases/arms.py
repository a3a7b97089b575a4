"""Phase 4, arms: every arm x replicate the preset declares (jobs/experiment/arms.py), trained side by side.

Several adapters per Ray Train run over one copy of the base (one per run under
FSDP), several runs at once where the GPUs allow (jobs/sizing/placement.py);
arms on the other base model in runs of their own over that base. Every arm of
a replicate trains on equally many rows (phases/stages.training_rows), so arms
differ in content alone.
"""

from __future__ import annotations

import dataclasses
import time

from common.atomic import write_jsonl
from jobs.experiment.arms import OTHER_BASE, numbers_seed
from jobs.phases.context import RunContext
from jobs.phases.stages import numbers_file, training_rows
from jobs.phases.training import record_trained, train_groups
from jobs.rundir.manifest import read_jsonl
from jobs.sources.number_sequences import shuffle_numbers


def arm_groups(pairs: list, runs: int, base_of) -> list[list]:
    """(stage, AdapterJob) pairs split into training runs: jobs that can share a worker group (the same
    base model, `base_of(stage)`, worker count, hardware, strategy...) go together, `runs` runs' worth
    at a time; under FSDP one job per run, since FSDP2 shards the adapter in place once."""
    from train.trainer import SHARED_KEYS

    kinds: dict[tuple, list] = {}
    for pair in pairs:
        kinds.setdefault((base_of(pair[0]), *(str(getattr(pair[1].cfg, k)) for k in SHARED_KEYS)), []).append(pair)
    groups = []
    for members in kinds.values():
        per_run = 1 if members[0][1].cfg.strategy == "fsdp" else -(-len(members) // runs)
        groups += [members[i : i + per_run] for i in range(0, len(members), per_run)]
    return groups


def run(ctx: RunContext, todo) -> None:
    from train.trainer import AdapterJob

    started, pairs, models = time.time(), [], list(ctx.models.values())
    for stage in todo:
        m = ctx.models[stage.name]
        rows = training_rows(ctx.manifest, models, m.replicate)
        data = ctx.run_dir / "arms" / m.name / "train.jsonl"
        kept = read_jsonl(ctx.run_dir / numbers_file(m.source, m.replicate))[:rows]
        write_jsonl(data, shuffle_numbers(kept, numbers_seed(ctx.cfg, m.replicate)) if m.shuffled else kept)
        # Job names key Ray datasets, whose log files are named after them: no '/' (m.adapter is "<arm>-<i>").
        teacher = str(ctx.trained(m.teacher))
        job = AdapterJob(m.adapter, str(data), ctx.trained(m.name), m.train)
        if m.loss == "logit_kl":  # on another base, the teacher's targets come from its own base
            job = dataclasses.replace(job, teacher=teacher, teacher_base=ctx.model_path if m.base == OTHER_BASE else None)
        if m.lora_init == "teacher_a":
            job = dataclasses.replace(job, init_a_from=teacher)
        pairs.append((stage, job))
    groups = arm_groups(pairs, ctx.arm_runs, lambda stage: ctx.models[stage.name].base)
    for stage, metrics in train_groups(ctx, "arms", groups, ctx.arm_runs):
        record_trained(ctx, stage, metrics, started)
