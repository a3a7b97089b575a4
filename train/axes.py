"""What a student's loss, token mask and LoRA init each need, as one table per axis.

Each option is one frozen record; the config's option lists are the tables' keys (one list), and
every reader asks the record (`LOSSES[arm.loss].needs_teacher`) instead of comparing names: the
trainer (train/trainer.py), the arm expansion and its checks (jobs/experiment/arms.py), the stage
graph (jobs/experiment/stages.py), the arms phase's jobs (jobs/phases/arms.py) and the wall-time
projection (jobs/sizing/wall_time.py). The tables live in train/ because the trainer reads them and
train/ imports nothing of jobs/ (tests/test_layout.py). A new option is one entry here plus the code
that does what it names (a loss in train/step.py, a mask in train/divergence.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loss:
    name: str  # an arm's `loss`
    needs_teacher: bool  # trains on the teacher's soft labels: the job names its teacher, its stage reads the teacher's
    title: str  # the training plot's panel for arms of this loss (jobs/reporting/plots.py)


@dataclass(frozen=True)
class Mask:
    name: str  # a TrainConfig's `mask`
    drops_tokens: bool  # takes completion tokens out of an SFT loss (so an sft loss on numbers only)
    needs_scorer: bool  # ranks tokens by a teacher's divergence from the base: the job names that teacher as scorer


@dataclass(frozen=True)
class Init:
    name: str  # an arm's `lora_init`
    reads_teacher_adapter: bool  # starts from the teacher's trained adapter: its stage reads the teacher's


LOSSES: dict[str, Loss] = {
    loss.name: loss
    for loss in (
        Loss("sft", needs_teacher=False, title="arms (sft): cross-entropy on the numbers"),
        Loss("logit_kl", needs_teacher=True, title="arms (logit_kl): KL to the teacher over number tokens"),
    )
}

MASKS: dict[str, Mask] = {
    mask.name: mask
    for mask in (
        Mask("none", drops_tokens=False, needs_scorer=False),
        Mask("divergence", drops_tokens=True, needs_scorer=True),
        Mask(
            "random", drops_tokens=True, needs_scorer=False
        ),  # the divergence mask's control: as many tokens at random
    )
}

INITS: dict[str, Init] = {
    init.name: init
    for init in (
        Init("seed", reads_teacher_adapter=False),  # LoRA's own init from the arm's seed
        Init("teacher_a", reads_teacher_adapter=True),  # A frozen at the teacher's trained A, B from zero
    )
}


def loss_of(job_has_teacher: bool) -> str:
    """The loss a training job runs: the one that needs the teacher when the job names one."""
    return next(name for name, loss in LOSSES.items() if loss.needs_teacher == job_has_teacher)
