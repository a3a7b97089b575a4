"""An arm model's training job: its teacher named wherever its loss, init or mask reads it (train/axes.py),
and the config's option lists are the axis tables' keys."""

from typing import get_args

from jobs.experiment.arms import arm_models
from jobs.experiment.config import ArmConfig, load_experiment
from jobs.phases.arms import adapter_job
from jobs.rundir.manifest import Manifest
from jobs.runtime.context import RunContext
from train.axes import INITS, LOSSES, MASKS
from train.config import TrainConfig
from train.results import TrainFacts

ARMS = (
    "arms={sft: {numbers: teacher}, kl: {numbers: teacher, loss: logit_kl}, a: {numbers: teacher, lora_init: teacher_a},"
    " div: {numbers: teacher, train: {mask: divergence}}, rnd: {numbers: teacher, train: {mask: random}}}"
)


def test_the_option_lists_are_the_tables_keys():
    assert get_args(ArmConfig.model_fields["loss"].annotation) == tuple(LOSSES)
    assert get_args(ArmConfig.model_fields["lora_init"].annotation) == tuple(INITS)
    assert get_args(TrainConfig.model_fields["mask"].annotation) == tuple(MASKS)
    assert get_args(TrainFacts.model_fields["loss_type"].annotation) == tuple(LOSSES)


def test_each_arm_job_names_its_teacher_where_its_axes_read_it(tmp_path):
    cfg = load_experiment(overrides=[ARMS, "replicates=1"])
    models = {m.name: m for m in arm_models(cfg)}
    ctx = RunContext(cfg, tmp_path, Manifest(tmp_path), tmp_path, {"base": "/models/base"}, models, [], "app", 8, 1)
    jobs = {m.arm: adapter_job(ctx, m, tmp_path / "rows.jsonl") for m in models.values()}
    teacher = str(ctx.trained("teacher"))
    named = {arm: (job.teacher, job.init_a_from, job.scorer) for arm, job in jobs.items()}
    assert named == {
        "sft": (None, None, None),
        "kl": (teacher, None, None),
        "a": (None, teacher, None),
        "div": (None, None, teacher),
        "rnd": (None, None, None),
    }
    assert all(job.teacher_base is None for job in jobs.values())  # all on the teacher's base
    assert (
        jobs["kl"].name == "kl-0"
        and jobs["kl"].output_dir == ctx.trained("kl/0")
        and jobs["kl"].data == str(tmp_path / "rows.jsonl")
    )
