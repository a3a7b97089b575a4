"""What a training run hands back, typed: `TrainResult`, one per job, and the `Marks` of its timeline.

A job's result travels one way: the worker builds it at the job's end (train/loop.py) and writes it
as the output folder's `train_metrics.json` (train/outputs.py); the driver reads it back, adds its own
marks and, to the run's last job, the run's final checkpoint (train/trainer.py), and returns it from
`train_lora_many`; the pipeline records what its stages need (jobs/runtime/training_runs.py). The file
keeps the form it has always had (docs/report.md): `metrics()` writes exactly those keys, and
`TrainResult.read` loads files written before some keys existed (each such field has its default).

The marks' names, and the spans of a run drawn from them (the report's timeline), are declared
here once: `Marks`' fields and `TRAINING_SPANS`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from train.axes import LOSSES

METRICS_FILE = "train_metrics.json"


class Marks(BaseModel):
    """Wall-clock times (seconds since the epoch) of one job's training run, in the order they
    happen. The worker's: its process started, its loop began, the base loaded (these three shared
    by the run's jobs), this job started, its first batch came, its last step ended, its save began.
    The driver's (train/trainer.py; only on a job this call trained): the call began (`run_started`),
    the workers were asked for (`fit_started`), the run's last job began saving (`workers_done`), and
    the run ended (`fit_finished`). A mark not reached (a job resumed at its final step has no first
    batch) is None, and absent on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_started: float | None = None
    fit_started: float | None = None
    process_started: float | None = None
    loop_started: float | None = None
    base_loaded: float | None = None
    job_started: float | None = None
    first_batch: float | None = None
    last_step: float | None = None
    saving: float | None = None
    workers_done: float | None = None
    fit_finished: float | None = None

    def at(self, **stamps: float) -> Marks:
        """A copy with `stamps` set; a name that is not a mark is a ValidationError."""
        return Marks(**{**self.model_dump(exclude_none=True), **stamps})

    def stamps(self) -> dict[str, float]:
        """The marks reached, by name: the form on disk (the worker's in the order it reached them)."""
        return self.model_dump(exclude_none=True)

    def spans(self) -> list[tuple[str, float, float]]:
        """(kind, start, end) of the run's spans whose both marks were reached (TRAINING_SPANS)."""
        out = []
        for kind, first, last in TRAINING_SPANS:
            start, end = getattr(self, first), getattr(self, last)
            if start is not None and end is not None:
                out.append((kind, start, end))
        return out


# A training run's spans (the report's timeline kinds, jobs/reporting/timeline.py): (kind, first mark, last mark).
TRAINING_SPANS = (
    ("prepare", "run_started", "fit_started"),  # tokenizing, a logit-KL teacher's targets: in the driver
    ("start-up", "fit_started", "loop_started"),  # Ray Train's controller, the worker processes, imports, process group
    ("model load", "loop_started", "base_loaded"),
    ("data wait", "job_started", "first_batch"),  # the job's adapter attached and its data stream's first batch
    ("compute", "first_batch", "last_step"),
    ("save", "last_step", "saving"),  # the last report and checkpoint
    ("teardown", "workers_done", "fit_finished"),  # the last adapter written, the workers and controller stopped
)


class StepReport(BaseModel):
    """What a job's worker group reports every `log_every` steps (train/loop.py `report`): to Ray
    Train (`ray.train.report`), to Ray metrics, and, the last one, in its result."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    step: int  # optimizer steps taken (the last one's number)
    epoch: int
    loss: float | None  # the report window's mean loss (None: no step since the report before)
    lr: float
    tokens_per_s: float
    padding_fraction: float
    step_time_s: float
    first_loss: float | None
    resumed_from_step: int | None  # the checkpoint's step this job's last attempt resumed from
    init_hash: str | None  # the LoRA init it started from (train/model.py adapter_hash); None under method full
    done: bool
    device: str | None = None  # "cuda" or "cpu" (None: a result written before it was recorded)
    gpu_mem_gib: float | None = None  # peak, on CUDA
    mfu: float | None = None  # on a GPU whose peak FLOP/s is known

    def metrics(self) -> dict:
        """The plain form: every key in its order, those of ABSENT_WHEN_NONE only when set."""
        return {k: v for k, v in self.model_dump(mode="json").items() if not (k in ABSENT_WHEN_NONE and v is None)}


class TrainFacts(BaseModel):
    """What the driver knows of a job before it trains (train/trainer.py `worker_jobs`): its rows
    (kept, cut, dropped), its steps and batch, its settings and loss; the worker reports them with
    its metrics."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: int
    rows_truncated: int
    rows_dropped: int
    total_steps: int
    global_batch_size: int
    train_config: dict[str, Any]  # TrainConfig.model_dump(), as trained (batch resolved for the workers)
    loss_type: Literal[tuple(LOSSES)]
    tokens_masked: int | None = None  # under a mask: the completion tokens it took out of the loss


# Keys a result has on disk only when they apply (a GPU's memory and MFU, a mask's count) or never
# (the run's checkpoint, which the driver adds): None leaves them out of the plain form.
ABSENT_WHEN_NONE = ("gpu_mem_gib", "mfu", "tokens_masked", "checkpoint")


class TrainResult(TrainFacts, StepReport):
    """One job's final metrics: its last report (StepReport's fields), its facts (TrainFacts'), the
    loss and the marks of every optimizer step, its timeline marks, the snapshots it kept and the run
    that finished it. Field names are the file's keys, in its order (the bases' fields first)."""

    loss_history: list[tuple[int, float]]  # [step, loss] per optimizer step, the mean over the workers
    # [step, time, lr, gradient norm before clipping]
    step_history: list[tuple[int, float, float, float]] = Field(default_factory=list)
    marks: Marks = Field(default_factory=Marks)
    snapshot_steps: list[int] = Field(default_factory=list)  # steps whose adapter snapshots/step-<k>/ keeps
    run_id: str | None = None  # the run that finished the output folder (train/trainer.py run_id_of)
    checkpoint: str | None = None  # the run's final checkpoint, on the run's last job (not on disk)

    @classmethod
    def of(cls, last: StepReport, facts: TrainFacts, **rest) -> TrainResult:
        """A finished job's result: its last report, its facts and the rest (histories, marks)."""
        return cls(**dict(last), **dict(facts), **rest)

    @classmethod
    def from_metrics(cls, data: dict) -> TrainResult:
        """A result from its plain form. A key (or mark) an older version wrote and nothing reads now
        is left out; one this version added is at its default."""
        known = {k: v for k, v in data.items() if k in cls.model_fields}
        if isinstance(known.get("marks"), dict):
            known["marks"] = {k: v for k, v in known["marks"].items() if k in Marks.model_fields}
        return cls.model_validate(known)

    @classmethod
    def read(cls, folder: str | Path) -> TrainResult:
        """The result an output folder holds (its train_metrics.json)."""
        return cls.from_metrics(json.loads((Path(folder) / METRICS_FILE).read_text()))

    def metrics(self) -> dict:
        """The plain form, train_metrics.json's: every key in its order, those of ABSENT_WHEN_NONE only when set."""
        out = StepReport.metrics(self)
        out["marks"] = self.marks.stamps()
        return out

    def write(self, folder: Path) -> None:
        """Write train_metrics.json into `folder`, as it has always been written."""
        (folder / METRICS_FILE).write_text(json.dumps(self.metrics(), indent=2, default=str))
